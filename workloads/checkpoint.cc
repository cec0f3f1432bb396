#include "workloads/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "comm/store/text.h"

namespace dlaunch::workloads {
namespace {

// File layout, all little-endian: magic "DLSGDCKP", u32 version, u32 epoch,
// u64 seed, u32 world size, u32 in/hidden/out, u64 parameter count, the
// parameters, the momentum buffer (f32 each), u32 CRC-32 of all before it.
constexpr char kMagic[8] = {'D', 'L', 'S', 'G', 'D', 'C', 'K', 'P'};
constexpr uint32_t kVersion = 1;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_floats(std::string& out, const std::vector<float>& v) {
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    put_u32(out, u);
  }
}

// Reads fields in order from a byte buffer; running past the end throws.
class Reader {
 public:
  Reader(const std::string& b, const std::filesystem::path& p)
      : b_(b), path_(p) {}
  uint64_t uint(int bytes) {
    need(bytes);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= uint64_t{static_cast<uint8_t>(b_[pos_ + i])} << (8 * i);
    }
    pos_ += bytes;
    return v;
  }
  std::vector<float> floats(size_t n) {
    need(n * 4);
    std::vector<float> v(n);
    for (float& f : v) {
      uint32_t u = static_cast<uint32_t>(uint(4));
      std::memcpy(&f, &u, 4);
    }
    return v;
  }

 private:
  void need(size_t n) {
    if (pos_ + n > b_.size()) {
      throw CheckpointError("checkpoint " + path_.string() +
                            " is truncated; delete it to start over");
    }
  }
  const std::string& b_;
  const std::filesystem::path& path_;
  size_t pos_ = 0;
};

std::string errno_text() { return comm::store::errno_text(errno); }

}  // namespace

std::filesystem::path checkpoint_path(const std::filesystem::path& dir) {
  return dir / "dl-sgd.ckpt";
}

void save_checkpoint(const std::filesystem::path& dir, const Checkpoint& c) {
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kVersion);
  put_u32(out, static_cast<uint32_t>(c.epoch));
  put_u64(out, c.seed);
  put_u32(out, static_cast<uint32_t>(c.world_size));
  put_u32(out, static_cast<uint32_t>(c.shape.in));
  put_u32(out, static_cast<uint32_t>(c.shape.hidden));
  put_u32(out, static_cast<uint32_t>(c.shape.out));
  put_u64(out, c.params.size());
  put_floats(out, c.params);
  put_floats(out, c.momentum);
  put_u32(out, static_cast<uint32_t>(
                   crc32(0, reinterpret_cast<const Bytef*>(out.data()),
                         static_cast<uInt>(out.size()))));

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw CheckpointError("cannot create checkpoint folder " + dir.string() +
                          ": " + ec.message());
  }
  std::filesystem::path final_path = checkpoint_path(dir);
  std::filesystem::path tmp =
      dir / ("dl-sgd.ckpt.tmp." + std::to_string(getpid()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw CheckpointError("cannot create " + tmp.string() + ": " +
                          errno_text());
  }
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw CheckpointError("cannot write " + tmp.string() + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw CheckpointError("cannot flush " + tmp.string() + ": " + why);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw CheckpointError("cannot rename " + tmp.string() + " to " +
                          final_path.string() + ": " + why);
  }
  // The rename is durable only once the folder entry is on disk.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::optional<Checkpoint> load_checkpoint(const std::filesystem::path& dir) {
  std::filesystem::path p = checkpoint_path(dir);
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    throw CheckpointError("cannot read checkpoint " + p.string() + ": " +
                          errno_text());
  }
  std::string b((std::istreambuf_iterator<char>(in)),
                std::istreambuf_iterator<char>());
  if (b.size() < sizeof kMagic + 4 ||
      std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) {
    throw CheckpointError("file " + p.string() +
                          " is not a dl-sgd checkpoint; delete it or choose "
                          "another --checkpoint-dir");
  }
  Reader r(b, p);
  r.uint(8);  // magic, checked above
  uint32_t version = static_cast<uint32_t>(r.uint(4));
  if (version != kVersion) {
    throw CheckpointError("checkpoint " + p.string() + " has format version " +
                          std::to_string(version) + "; this dl-sgd reads " +
                          std::to_string(kVersion) + " (delete it to restart)");
  }
  uint32_t stored_crc = 0;
  for (int i = 0; i < 4; ++i) {
    stored_crc |= uint32_t{static_cast<uint8_t>(b[b.size() - 4 + i])}
                  << (8 * i);
  }
  uint32_t crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(b.data()),
                                  static_cast<uInt>(b.size() - 4)));
  if (crc != stored_crc) {
    throw CheckpointError("checkpoint " + p.string() +
                          " fails its checksum (corrupt); delete it to start "
                          "over");
  }
  Checkpoint c;
  c.epoch = static_cast<int>(r.uint(4));
  c.seed = r.uint(8);
  c.world_size = static_cast<int>(r.uint(4));
  c.shape.in = static_cast<int>(r.uint(4));
  c.shape.hidden = static_cast<int>(r.uint(4));
  c.shape.out = static_cast<int>(r.uint(4));
  uint64_t n = r.uint(8);
  if (n * 8 + 4 > b.size()) {
    throw CheckpointError("checkpoint " + p.string() +
                          " is truncated; delete it to start over");
  }
  c.params = r.floats(n);
  c.momentum = r.floats(n);
  return c;
}

}  // namespace dlaunch::workloads
