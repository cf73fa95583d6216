#include "tensorxfer/collectives/signal_layout.h"

#include <cstring>
#include <limits>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::collectives {
namespace {

std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  TENSORXFER_CHECK(InvalidArgument, a <= std::numeric_limits<std::size_t>::max() - b,
                   "IpcMemory layout: ", what, " overflows size_t");
  return a + b;
}

std::size_t round_up(std::size_t value, std::size_t alignment, const char* what) {
  return checked_add(value, alignment - 1, what) / alignment * alignment;
}

}  // namespace

SignalLayout SignalLayout::compute(int world_size, std::size_t data_nbytes) {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1 && world_size <= kMaxWorldSize,
                   "IpcMemory: world_size must be in [1, ", kMaxWorldSize, "], got ", world_size);
  SignalLayout layout;
  layout.world_size = world_size;
  layout.wake_offset = sizeof(SignalHeader);
  layout.barrier_in_offset = layout.wake_offset + sizeof(WakeLine);
  const std::size_t lines_nbytes = static_cast<std::size_t>(world_size) * sizeof(FlagLine);
  layout.barrier_out_offset = layout.barrier_in_offset + lines_nbytes;
  layout.data_offset = round_up(layout.barrier_out_offset + lines_nbytes, kDataAlignment, "data offset");
  layout.data_nbytes = data_nbytes;
  layout.total_nbytes = checked_add(layout.data_offset, round_up(data_nbytes, kDataAlignment, "data size"),
                                    "total size");
  return layout;
}

uint64_t signal_header_checksum(const SignalHeader& header) noexcept {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&header);
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (std::size_t i = 0; i < offsetof(SignalHeader, checksum); ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

SignalHeader make_signal_header(const SignalLayout& layout, int rank) {
  SignalHeader header;
  std::memset(&header, 0, sizeof(header));
  header.magic = kSignalMagic;
  header.layout_version = kSignalLayoutVersion;
  header.world_size = layout.world_size;
  header.rank = rank;
  header.data_offset = layout.data_offset;
  header.data_nbytes = layout.data_nbytes;
  header.checksum = signal_header_checksum(header);
  return header;
}

void validate_signal_header(const SignalHeader& header, std::size_t payload_nbytes, int expected_rank,
                            int expected_world_size, const std::string& context) {
  auto fail = [&](const char* field, const auto& expected, const auto& got) {
    throw CorruptSegment(detail::concat(context, ": IpcMemory header field ", field, ": expected ", expected,
                                        ", got ", got));
  };
  if (header.magic != kSignalMagic) fail("magic", kSignalMagic, header.magic);
  if (header.layout_version != kSignalLayoutVersion) {
    fail("layout_version", kSignalLayoutVersion, header.layout_version);
  }
  const uint64_t checksum = signal_header_checksum(header);
  if (header.checksum != checksum) fail("checksum", checksum, header.checksum);
  if (header.world_size != expected_world_size) fail("world_size", expected_world_size, header.world_size);
  if (header.rank != expected_rank) fail("rank", expected_rank, header.rank);
  if (header.reserved != 0 || header.padding[0] != 0 || header.padding[1] != 0) {
    fail("reserved and padding", 0, header.reserved | header.padding[0] | header.padding[1]);
  }
  // Recompute the layout from the validated fields: every offset must match the size.
  SignalLayout layout;
  try {
    layout = SignalLayout::compute(header.world_size, header.data_nbytes);
  } catch (const InvalidArgument& error) {
    fail("data_nbytes", "a size that fits", error.what());
  }
  if (header.data_offset != layout.data_offset) fail("data_offset", layout.data_offset, header.data_offset);
  if (payload_nbytes != layout.total_nbytes) fail("segment size", layout.total_nbytes, payload_nbytes);
}

}  // namespace tensorxfer::collectives
