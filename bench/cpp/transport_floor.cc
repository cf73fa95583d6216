// What moving bytes between two processes of this host can cost at best: the
// floors behind the copy services' and collectives' speed targets.
//
// Two processes (fork) each send `bytes` to the other and receive as many,
// at the same time (the copy services' 2-rank cases), by:
//   * memcpy within one process (private -> private): one user-space copy,
//     the cost if the receiver could read the sender's memory directly;
//   * memcpy from the peer's shared memory: the same, when the source already
//     lives in a shared mapping (zero-copy buffers);
//   * process_vm_readv from the peer's private memory: the single kernel
//     copy (cross-memory attach) that Open MPI and the shm copy service use;
//   * two copies through shared slots, pipelined: sender copies into a slot,
//     receiver copies out (what a pack/send/unpack pipeline does at best);
// and, for many small tensors, process_vm_readv with an iovec per tensor.
// Medians of --repeats runs, slower rank. Not a Google Benchmark program: it
// needs two processes; run `transport_floor [--mib N] [--repeats R]`.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <sched.h>

namespace {

using Clock = std::chrono::steady_clock;

// "<model name> (family F model M; avx2, avx512f)" from /proc/cpuinfo's first CPU.
std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string name = "unknown CPU", family = "?", model = "?", simd;
  for (std::string line; std::getline(cpuinfo, line) && !line.empty();) {
    const std::string value = line.find(": ") == std::string::npos ? "" : line.substr(line.find(": ") + 2);
    if (line.rfind("model name", 0) == 0) name = value;
    else if (line.rfind("cpu family", 0) == 0) family = value;
    else if (line.rfind("model\t", 0) == 0) model = value;
    else if (line.rfind("flags", 0) == 0) {
      for (const char* flag : {" avx2 ", " avx512f "}) {
        if ((" " + value + " ").find(flag) != std::string::npos) simd += (simd.empty() ? "" : ", ") + std::string(flag + 1, std::strlen(flag) - 2);
      }
    }
  }
  return name + " (family " + family + " model " + model + "; " + (simd.empty() ? "no AVX2" : simd) + ")";
}

// Shared between the two processes: a barrier, pids, slot counters, times.
struct Control {
  pthread_barrier_t barrier;
  pid_t pids[2];
  alignas(64) std::atomic<uint64_t> produced[2];
  alignas(64) std::atomic<uint64_t> consumed[2];
  double seconds[2];
};

// An anonymous shared mapping, unmapped on scope exit.
class SharedMapping {
 public:
  explicit SharedMapping(std::size_t nbytes) : nbytes_(nbytes) {
    data_ = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (data_ == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
  }
  ~SharedMapping() { ::munmap(data_, nbytes_); }
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_;
  std::size_t nbytes_;
};

constexpr std::size_t kSlotBytes = std::size_t{1} << 20;
constexpr uint64_t kSlots = 4;

struct Rank {
  int me;
  Control* control;
  char* private_source;
  char* private_target;
  char* shared_sources[2];  // each rank's source copy in shared memory
  char* slots[2];           // each rank's outgoing slots
  std::size_t nbytes;
  std::vector<char*> small_sources, small_targets;  // many small private tensors
  std::size_t small_nbytes;
  pid_t peer() const { return control->pids[1 - me]; }
};

void check_read(ssize_t got, std::size_t expected) {
  if (got != static_cast<ssize_t>(expected)) {
    std::perror("process_vm_readv");
    std::exit(1);
  }
}

void cma_large(Rank& rank) {
  constexpr std::size_t kCall = std::size_t{4} << 20;
  for (std::size_t done = 0; done < rank.nbytes; done += kCall) {
    const std::size_t n = std::min(kCall, rank.nbytes - done);
    iovec local{rank.private_target + done, n};
    iovec remote{rank.private_source + done, n};  // the peer's address
    check_read(::process_vm_readv(rank.peer(), &local, 1, &remote, 1, 0), n);
  }
}

void two_copies(Rank& rank, uint64_t round) {
  const int me = rank.me, peer = 1 - me;
  Control& control = *rank.control;
  const uint64_t chunks = rank.nbytes / kSlotBytes;
  const uint64_t base = round * chunks;
  uint64_t produced = 0, consumed = 0;
  while (produced < chunks || consumed < chunks) {
    bool progress = false;
    if (produced < chunks && base + produced - control.consumed[me].load(std::memory_order_acquire) < kSlots) {
      std::memcpy(rank.slots[me] + ((base + produced) % kSlots) * kSlotBytes,
                  rank.private_source + produced * kSlotBytes, kSlotBytes);
      control.produced[me].store(base + ++produced, std::memory_order_release);
      progress = true;
    }
    if (consumed < chunks && control.produced[peer].load(std::memory_order_acquire) > base + consumed) {
      std::memcpy(rank.private_target + consumed * kSlotBytes,
                  rank.slots[peer] + ((base + consumed) % kSlots) * kSlotBytes, kSlotBytes);
      control.consumed[peer].store(base + ++consumed, std::memory_order_release);
      progress = true;
    }
    if (!progress) ::sched_yield();
  }
}

void cma_small(Rank& rank) {
  constexpr std::size_t kIovecs = 1024;  // IOV_MAX
  std::vector<iovec> local(kIovecs), remote(kIovecs);
  const std::size_t count = rank.small_sources.size();
  for (std::size_t first = 0; first < count; first += kIovecs) {
    const std::size_t n = std::min(kIovecs, count - first);
    for (std::size_t i = 0; i < n; ++i) {
      local[i] = {rank.small_targets[first + i], rank.small_nbytes};
      remote[i] = {rank.small_sources[first + i], rank.small_nbytes};  // the peer's addresses
    }
    check_read(::process_vm_readv(rank.peer(), local.data(), n, remote.data(), n, 0), n * rank.small_nbytes);
  }
}

void memcpy_small(Rank& rank) {
  for (std::size_t i = 0; i < rank.small_sources.size(); ++i) {
    std::memcpy(rank.small_targets[i], rank.small_sources[i], rank.small_nbytes);
  }
}

// Runs `body` `repeats` times in both processes at once; the slower rank's median.
double median_seconds(Rank& rank, int repeats, const std::function<void(uint64_t)>& body) {
  std::vector<double> samples;
  for (int repeat = 0; repeat < repeats + 1; ++repeat) {  // + 1 warm-up
    pthread_barrier_wait(&rank.control->barrier);
    const auto begin = Clock::now();
    body(static_cast<uint64_t>(repeat));
    rank.control->seconds[rank.me] = std::chrono::duration<double>(Clock::now() - begin).count();
    pthread_barrier_wait(&rank.control->barrier);
    if (repeat > 0) samples.push_back(std::max(rank.control->seconds[0], rank.control->seconds[1]));
    pthread_barrier_wait(&rank.control->barrier);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256, small_count = 10000, small_nbytes = 4096;
  int repeats = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mib") mib = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (flag == "--small") small_count = std::strtoul(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: transport_floor [--mib N] [--repeats R] [--small COUNT]\n");
      return 2;
    }
  }
  const std::size_t nbytes = std::max<std::size_t>(1, mib) << 20;
  SharedMapping control_mapping(sizeof(Control));
  SharedMapping shared(2 * nbytes + 2 * kSlots * kSlotBytes);
  SharedMapping address_table(2 * (small_count + 1) * sizeof(uintptr_t));
  auto* addresses = reinterpret_cast<uintptr_t*>(address_table.data());
  auto* control = new (control_mapping.data()) Control{};
  pthread_barrierattr_t attributes;
  pthread_barrierattr_init(&attributes);
  pthread_barrierattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&control->barrier, &attributes, 2);

  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  Rank rank{};
  rank.me = child == 0 ? 1 : 0;
  rank.control = control;
  control->pids[rank.me] = ::getpid();
  // Private buffers (allocated after fork: each process's own pages).
  std::vector<char> source(nbytes, static_cast<char>(rank.me + 1)), target(nbytes, 0);
  rank.private_source = source.data();
  rank.private_target = target.data();
  rank.nbytes = nbytes;
  for (int r = 0; r < 2; ++r) {
    rank.shared_sources[r] = shared.data() + r * nbytes;
    rank.slots[r] = shared.data() + 2 * nbytes + r * kSlots * kSlotBytes;
  }
  std::memset(rank.shared_sources[rank.me], rank.me + 1, nbytes);
  rank.small_nbytes = small_nbytes;
  std::vector<std::vector<char>> small_sources(small_count, std::vector<char>(small_nbytes, static_cast<char>(rank.me + 1)));
  std::vector<std::vector<char>> small_targets(small_count, std::vector<char>(small_nbytes, 0));
  for (std::size_t i = 0; i < small_count; ++i) {
    rank.small_sources.push_back(small_sources[i].data());
    rank.small_targets.push_back(small_targets[i].data());
  }
  uintptr_t* own_addresses = addresses + rank.me * (small_count + 1);
  own_addresses[0] = reinterpret_cast<uintptr_t>(rank.private_source);
  for (std::size_t i = 0; i < small_count; ++i) own_addresses[1 + i] = reinterpret_cast<uintptr_t>(rank.small_sources[i]);
  pthread_barrier_wait(&control->barrier);  // both have published their memory and pids

  // The peer's buffers were allocated after fork, at addresses of its own: it
  // publishes them in the shared address table.
  Rank remote_view = rank;  // where this rank reads the peer's sources from
  remote_view.private_source = reinterpret_cast<char*>(addresses[(1 - rank.me) * (small_count + 1)]);
  for (std::size_t i = 0; i < small_count; ++i) {
    remote_view.small_sources[i] = reinterpret_cast<char*>(addresses[(1 - rank.me) * (small_count + 1) + 1 + i]);
  }
  pthread_barrier_wait(&control->barrier);

  const double large = static_cast<double>(nbytes), small = static_cast<double>(small_count * small_nbytes);
  struct Row {
    std::string name;
    double seconds;
    double bytes;
  };
  std::vector<Row> rows;
  auto measure = [&](const std::string& name, double bytes, const std::function<void(uint64_t)>& body) {
    rows.push_back({name, median_seconds(rank, repeats, body), bytes});
  };
  measure("memcpy private -> private (one process)", large,
          [&](uint64_t) { std::memcpy(rank.private_target, rank.private_source, nbytes); });
  measure("memcpy from the peer's shared memory", large,
          [&](uint64_t) { std::memcpy(rank.private_target, rank.shared_sources[1 - rank.me], nbytes); });
  measure("process_vm_readv from the peer (4 MiB calls)", large, [&](uint64_t) { cma_large(remote_view); });
  measure("two copies through 1 MiB shared slots", large, [&](uint64_t round) { two_copies(rank, round); });
  measure("many small: memcpy (one process)", small, [&](uint64_t) { memcpy_small(rank); });
  measure("many small: process_vm_readv, an iovec each", small, [&](uint64_t) { cma_small(remote_view); });
  if (std::memcmp(rank.private_target, rank.shared_sources[1 - rank.me], nbytes) != 0 ||
      rank.small_targets.back()[0] != static_cast<char>(2 - rank.me)) {
    std::fprintf(stderr, "transport_floor: rank %d received wrong bytes\n", rank.me);
    return 1;
  }

  if (rank.me == 0) {
    std::printf("== transport floors on %s (%ld CPUs), 2 processes, each way at once ==\n", cpu_model().c_str(),
                ::sysconf(_SC_NPROCESSORS_ONLN));
    std::printf("large: %zu MiB per rank; small: %zu x %zu B; median of %d, slower rank\n", mib, small_count,
                small_nbytes, repeats);
    std::printf("%-48s %10s %10s\n", "transport", "ms", "GB/s/rank");
    for (const Row& row : rows) {
      std::printf("%-48s %10.2f %10.2f\n", row.name.c_str(), row.seconds * 1e3, row.bytes / row.seconds / 1e9);
    }
    ::waitpid(child, nullptr, 0);
  }
  return 0;
}
