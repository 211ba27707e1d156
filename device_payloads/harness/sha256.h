// A small self-contained SHA-256 (FIPS 180-4), so the harness checks pushed files on a device with no shell.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace devicelab {

class Sha256 {
  public:
    Sha256();
    void update(const void * data, size_t len);
    std::string hex();  // finishes: the digest as 64 lowercase hex characters

  private:
    void block(const uint8_t * p);
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t used_ = 0;
    uint64_t bytes_ = 0;
};

// "" when the file cannot be read
std::string sha256_file(const char * path);

}  // namespace devicelab
