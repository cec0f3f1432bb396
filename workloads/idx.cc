#include "workloads/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

namespace dlaunch::workloads {
namespace {

// The whole file, inflated when it starts with the gzip magic. gzread passes
// uncompressed files through unchanged, so one path serves both.
std::vector<uint8_t> read_all(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw DataError("data file " + path.string() +
                    " does not exist or is not a regular file");
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw DataError("cannot open data file " + path.string() + ": " +
                    std::strerror(errno));
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
  gzbuffer(f, 1 << 17);
  std::vector<uint8_t> out;
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    size_t old = out.size();
    out.resize(old + kChunk);
    int got = gzread(f, out.data() + old, kChunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      throw DataError("cannot read data file " + path.string() + ": " +
                      (err == Z_ERRNO ? std::strerror(errno) : msg) +
                      " (corrupt or truncated gzip?)");
    }
    out.resize(old + static_cast<size_t>(got));
    if (got == 0) break;
  }
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes = read_all(path);
  if (bytes.size() < 4) {
    throw DataError("data file " + path.string() + " is " +
                    std::to_string(bytes.size()) +
                    " bytes: too short for an IDX header");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%02x%02x%02x%02x", bytes[0], bytes[1],
                  bytes[2], bytes[3]);
    throw DataError("data file " + path.string() + " has magic " + buf +
                    ", not an IDX file (expected 0x0000TTDD, e.g. 0x00000803 "
                    "for images, 0x00000801 for labels)");
  }
  if (bytes[2] != 0x08) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", bytes[2]);
    throw DataError("data file " + path.string() + " has IDX element type " +
                    buf + "; only unsigned bytes (0x08) are supported");
  }
  size_t ndims = bytes[3];
  if (ndims == 0) {
    throw DataError("data file " + path.string() +
                    " declares 0 dimensions in its IDX header");
  }
  size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) {
    throw DataError("data file " + path.string() + " declares " +
                    std::to_string(ndims) + " dimensions but has only " +
                    std::to_string(bytes.size()) + " bytes");
  }
  IdxArray out;
  size_t expect = 1;
  for (size_t i = 0; i < ndims; ++i) {
    out.dims.push_back(be32(&bytes[4 + 4 * i]));
    expect *= out.dims.back();
  }
  if (bytes.size() - header != expect) {
    std::string shape;
    for (uint32_t d : out.dims) {
      shape += (shape.empty() ? "" : "x") + std::to_string(d);
    }
    throw DataError("data file " + path.string() + " has " +
                    std::to_string(bytes.size() - header) +
                    " data bytes but its header declares " + shape + " = " +
                    std::to_string(expect) + " (truncated or corrupt file)");
  }
  out.data.assign(bytes.begin() + static_cast<ptrdiff_t>(header), bytes.end());
  return out;
}

namespace {

std::filesystem::path pick(const std::filesystem::path& dir,
                           const std::string& base) {
  std::filesystem::path gz = dir / (base + ".gz");
  std::filesystem::path raw = dir / base;
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  if (std::filesystem::exists(raw, ec)) return raw;
  throw DataError("data set file missing: neither " + gz.string() + " nor " +
                  raw.string() +
                  " exists; install Debian's dataset-fashion-mnist "
                  "(scripts/setup) or pass --data DIR with MNIST-format files");
}

}  // namespace

Dataset load_mnist_split(const std::filesystem::path& dir,
                         const std::string& split) {
  std::filesystem::path ipath = pick(dir, split + "-images-idx3-ubyte");
  std::filesystem::path lpath = pick(dir, split + "-labels-idx1-ubyte");
  IdxArray images = read_idx(ipath);
  IdxArray labels = read_idx(lpath);
  if (images.dims.size() != 3) {
    throw DataError("image file " + ipath.string() + " has " +
                    std::to_string(images.dims.size()) +
                    " dimensions; expected 3 (count, rows, cols)");
  }
  if (labels.dims.size() != 1) {
    throw DataError("label file " + lpath.string() + " has " +
                    std::to_string(labels.dims.size()) +
                    " dimensions; expected 1 (count)");
  }
  if (images.dims[0] != labels.dims[0]) {
    throw DataError("image file " + ipath.string() + " holds " +
                    std::to_string(images.dims[0]) + " images but " +
                    lpath.string() + " holds " +
                    std::to_string(labels.dims[0]) + " labels");
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] > 9) {
      throw DataError("label file " + lpath.string() + " has label " +
                      std::to_string(labels.data[i]) + " at index " +
                      std::to_string(i) + "; expected 0..9");
    }
  }
  Dataset d;
  d.n = images.dims[0];
  d.rows = images.dims[1];
  d.cols = images.dims[2];
  d.images = std::move(images.data);
  d.labels = std::move(labels.data);
  return d;
}

}  // namespace dlaunch::workloads
