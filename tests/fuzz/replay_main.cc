// Runs a fuzz target's LLVMFuzzerTestOneInput on files, without libFuzzer: the
// fast tier's regression tests (ctest fuzz_replay.<target>) replay every input
// committed under tests/fuzz/regressions/<target>/ and the seed corpus
// tests/fuzz/corpus/<target>/ with the compiler of the ordinary build.
//   <target>_replay PATH...   (files, or directories of files)
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace {

std::vector<std::string> files_under(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {};
  if (!S_ISDIR(info.st_mode)) return {path};
  std::vector<std::string> files;
  if (DIR* directory = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(directory)) {
      const std::string name = entry->d_name;
      if (name == "." || name == ".." || name[0] == '.') continue;
      for (const std::string& file : files_under(path + "/" + name)) files.push_back(file);
    }
    ::closedir(directory);
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    for (const std::string& file : files_under(argv[i])) {
      std::ifstream stream(file, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  std::printf("%zu inputs replayed without a finding\n", replayed);
  return replayed == 0 ? 1 : 0;  // no input at all: a wrong path, not a pass
}
