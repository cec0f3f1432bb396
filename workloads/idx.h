#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace dlaunch::workloads {

// A data file that is missing, unreadable or not what it claims to be. The
// message names the path, what is wrong and, where there is one, the fix.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The contents of one IDX file (the MNIST format): unsigned bytes with their
// dimensions, e.g. {60000, 28, 28} for images or {60000} for labels.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads an IDX file of unsigned bytes (type code 0x08), gzip-compressed or
// not (detected from the content, not the name). Throws DataError naming
// `path` for a missing file, a bad magic number, an unsupported element type
// or a size that does not match the header.
IdxArray read_idx(const std::filesystem::path& path);

// One split of an MNIST-format data set: n images of rows*cols pixels
// (row-major bytes, 0..255) and n labels in 0..9.
struct Dataset {
  size_t n = 0;
  size_t rows = 0;
  size_t cols = 0;
  std::vector<uint8_t> images;  // n * rows * cols
  std::vector<uint8_t> labels;  // n

  size_t pixels() const { return rows * cols; }
};

// Where MNIST-format data sets live: `dir` holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
// Debian's dataset-fashion-mnist installs Fashion-MNIST here.
inline constexpr const char* kDefaultDataDir =
    "/usr/share/datasets/fashion-mnist";

// Loads the "train" or "t10k" split from `dir`, preferring the .gz file and
// falling back to the uncompressed one. Throws DataError when the files are
// missing (naming both tried paths and the Debian package), malformed, or
// disagree on the number of samples, or when a label is not in 0..9.
Dataset load_mnist_split(const std::filesystem::path& dir,
                         const std::string& split);

}  // namespace dlaunch::workloads
