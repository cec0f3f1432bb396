#include "workloads/idx.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace dlaunch::workloads {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh folder per test, removed afterwards.
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }

  static std::vector<uint8_t> idx_bytes(std::vector<uint32_t> dims,
                                        const std::vector<uint8_t>& data,
                                        uint8_t type = 0x08) {
    std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
    for (uint32_t d : dims) {
      for (int s = 24; s >= 0; s -= 8) b.push_back((d >> s) & 0xff);
    }
    b.insert(b.end(), data.begin(), data.end());
    return b;
  }
  fs::path write_raw(const std::string& name, const std::vector<uint8_t>& b) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()),
               static_cast<std::streamsize>(b.size()));
    return p;
  }
  fs::path write_gz(const std::string& name, const std::vector<uint8_t>& b) {
    fs::path p = dir_ / name;
    gzFile f = gzopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, b.data(), static_cast<unsigned>(b.size())),
              static_cast<int>(b.size()));
    gzclose(f);
    return p;
  }
  // A 3-sample, 2x2 split named `split` in dir_.
  void write_split(const std::string& split, bool gz) {
    std::vector<uint8_t> px = {0, 1, 2, 3, 10, 11, 12, 13, 250, 251, 252, 255};
    auto w = [&](const std::string& n, const std::vector<uint8_t>& b) {
      gz ? write_gz(n + ".gz", b) : write_raw(n, b);
    };
    w(split + "-images-idx3-ubyte", idx_bytes({3, 2, 2}, px));
    w(split + "-labels-idx1-ubyte", idx_bytes({3}, {7, 0, 9}));
  }

  ::dlaunch::testing::TempDir tmp_{"dl-idx-test"};
  fs::path dir_;
};

TEST_F(IdxTest, ReadsUncompressed) {
  fs::path p = write_raw("a", idx_bytes({2, 3}, {1, 2, 3, 4, 5, 6}));
  IdxArray a = read_idx(p);
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(a.data, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST_F(IdxTest, ReadsGzip) {
  std::vector<uint8_t> data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = i * 7 % 256;
  fs::path p = write_gz("a.gz", idx_bytes({5000}, data));
  IdxArray a = read_idx(p);
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{5000}));
  EXPECT_EQ(a.data, data);
}

TEST_F(IdxTest, MissingFileNamesPath) {
  try {
    read_idx(dir_ / "nope");
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir_ / "nope").string()));
    EXPECT_THAT(e.what(), HasSubstr("does not exist"));
  }
}

TEST_F(IdxTest, BadMagic) {
  fs::path p = write_raw("bad", {'P', 'K', 3, 4, 0, 0, 0, 0});
  try {
    read_idx(p);
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr(p.string()));
    EXPECT_THAT(e.what(), HasSubstr("not an IDX file"));
  }
}

TEST_F(IdxTest, UnsupportedType) {
  fs::path p = write_raw("f", idx_bytes({1}, {0, 0, 0, 0}, 0x0d));
  EXPECT_THROW(
      {
        try {
          read_idx(p);
        } catch (const DataError& e) {
          EXPECT_THAT(e.what(), HasSubstr("element type 0x0d"));
          throw;
        }
      },
      DataError);
}

TEST_F(IdxTest, TruncatedData) {
  fs::path p = write_gz("t.gz", idx_bytes({2, 3}, {1, 2, 3, 4, 5}));
  try {
    read_idx(p);
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr(p.string()));
    EXPECT_THAT(e.what(), HasSubstr("5 data bytes"));
    EXPECT_THAT(e.what(), HasSubstr("2x3 = 6"));
  }
}

TEST_F(IdxTest, ShortHeader) {
  fs::path p = write_raw("s", {0, 0, 8, 3, 0, 0});
  EXPECT_THROW(read_idx(p), DataError);
  fs::path q = write_raw("e", {});
  EXPECT_THROW(read_idx(q), DataError);
}

TEST_F(IdxTest, LoadsSplitGzAndRaw) {
  write_split("train", /*gz=*/true);
  write_split("t10k", /*gz=*/false);
  for (const char* split : {"train", "t10k"}) {
    Dataset d = load_mnist_split(dir_, split);
    EXPECT_EQ(d.n, 3u);
    EXPECT_EQ(d.rows, 2u);
    EXPECT_EQ(d.cols, 2u);
    EXPECT_EQ(d.labels, (std::vector<uint8_t>{7, 0, 9}));
    EXPECT_EQ(d.images[11], 255);
  }
}

TEST_F(IdxTest, MissingSplitNamesBothPathsAndPackage) {
  try {
    load_mnist_split(dir_, "train");
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr((dir_ / "train-images-idx3-ubyte.gz").string()));
    EXPECT_THAT(e.what(), HasSubstr("dataset-fashion-mnist"));
    EXPECT_THAT(e.what(), HasSubstr("--data"));
  }
}

TEST_F(IdxTest, CountMismatch) {
  write_raw("train-images-idx3-ubyte", idx_bytes({2, 1, 1}, {1, 2}));
  write_raw("train-labels-idx1-ubyte", idx_bytes({3}, {1, 2, 3}));
  try {
    load_mnist_split(dir_, "train");
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 images but"));
  }
}

TEST_F(IdxTest, LabelOutOfRange) {
  write_raw("train-images-idx3-ubyte", idx_bytes({2, 1, 1}, {1, 2}));
  write_raw("train-labels-idx1-ubyte", idx_bytes({2}, {1, 10}));
  try {
    load_mnist_split(dir_, "train");
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("label 10 at index 1"));
  }
}

TEST(IdxRealData, FashionMnistShapes) {
  if (!fs::exists(fs::path(kDefaultDataDir) / "t10k-labels-idx1-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  Dataset d = load_mnist_split(kDefaultDataDir, "t10k");
  EXPECT_EQ(d.n, 10000u);
  EXPECT_EQ(d.rows, 28u);
  EXPECT_EQ(d.cols, 28u);
  EXPECT_EQ(d.images.size(), 10000u * 784u);
}

}  // namespace
}  // namespace dlaunch::workloads
