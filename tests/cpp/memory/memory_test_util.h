// Helpers for the memory tests: fresh anonymous mappings and /proc/self/smaps lookups.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace tensorxfer::testing {

// An anonymous private mapping that no one has touched yet; unmapped on scope exit.
class FreshMapping {
 public:
  explicit FreshMapping(std::size_t bytes, int protection = PROT_READ | PROT_WRITE) : bytes_(bytes) {
    void* data = ::mmap(nullptr, bytes, protection, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = data == MAP_FAILED ? nullptr : static_cast<unsigned char*>(data);
  }
  FreshMapping(const FreshMapping&) = delete;
  FreshMapping& operator=(const FreshMapping&) = delete;
  ~FreshMapping() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  unsigned char* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  unsigned char* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// The value (first number) of `field` ("Locked:", "THPeligible:", ...) in the
// /proc/self/smaps entry of the mapping containing `address`; -1 if not found.
inline long long smaps_field(const void* address, const std::string& field) {
  const auto target = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = begin <= target && target < end;
      continue;
    }
    if (inside && line.rfind(field, 0) == 0) {
      std::istringstream value(line.substr(field.size()));
      long long number = -1;
      value >> number;
      return number;
    }
  }
  return -1;
}

}  // namespace tensorxfer::testing
