// safetensors: a round trip through bytes and a file keeps every dtype, shape and byte; the
// layout follows the reference writer; half and bfloat16 decode exactly; and each kind of broken
// file is refused with an InputError naming the file, the tensor and the expectation.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "executor/safetensors.hpp"
#include "profiles/errors.hpp"

using loom::executor::DType;
using loom::executor::SafetensorsFile;
using loom::executor::TensorView;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device random;
    path = fs::temp_directory_path() /
           ("loom-test-safetensors-" + std::to_string(random()) + std::to_string(random()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path / name, std::ios::binary);
    out << bytes;
    return (path / name).string();
  }
};

template <typename T>
TensorView view(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                const std::vector<T>& values) {
  return TensorView{name, dtype, std::move(shape),
                    reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(T)};
}

// A file with this header text (padded to 8 bytes with spaces) and `buffer_bytes` zero bytes.
std::string raw_file(const std::string& header, std::size_t buffer_bytes,
                     std::uint64_t declared_length = 0) {
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint64_t length = declared_length != 0 ? declared_length : text.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((length >> (8 * i)) & 0xFF);
  return out + text + std::string(buffer_bytes, '\0');
}

std::string bytes_of(const TensorView& t) {
  return std::string(reinterpret_cast<const char*>(t.data), t.size_bytes);
}

void require_refused(const std::string& bytes, const std::string& path, const std::string& word) {
  TempDir dir;
  const std::string file = dir.write("bad.safetensors", bytes);
  INFO("expected an InputError at " << path << " containing " << word);
  for (int through_file = 0; through_file < 2; ++through_file) {
    try {
      if (through_file == 1) {
        (void)SafetensorsFile::read(file);
      } else {
        (void)SafetensorsFile::parse(bytes, file);
      }
    } catch (const loom::InputError& e) {
      INFO("message: " << e.what());
      CHECK(e.source() == file);
      CHECK(e.path() == path);
      CHECK_THAT(e.expectation(), Catch::Contains(word));
      continue;
    }
    FAIL("no InputError");
  }
}

}  // namespace

TEST_CASE("dtype names and sizes", "[safetensors]") {
  using loom::executor::element_size;
  using loom::executor::to_string;
  CHECK(element_size(DType::kF32) == 4);
  CHECK(element_size(DType::kF16) == 2);
  CHECK(element_size(DType::kBF16) == 2);
  CHECK(element_size(DType::kF64) == 8);
  CHECK(element_size(DType::kI64) == 8);
  CHECK(element_size(DType::kBool) == 1);
  CHECK(to_string(DType::kBF16) == "BF16");
  CHECK(to_string(DType::kBool) == "BOOL");
  DType dtype = DType::kF32;
  CHECK(loom::executor::dtype_from_string("I16", dtype));
  CHECK(dtype == DType::kI16);
  CHECK_FALSE(loom::executor::dtype_from_string("U64", dtype));
  CHECK(loom::executor::element_count({2, 3, 4}) == 24);
  CHECK(loom::executor::element_count({}) == 1);
  CHECK(loom::executor::element_count({5, 0}) == 0);
}

TEST_CASE("round trip: F32, F16, BF16, I64, a scalar, an empty tensor, metadata", "[safetensors]") {
  const std::vector<float> weight = {1.5F, -2.0F, 0.25F, 3.0F, -0.0F, 1e-30F};
  const std::vector<std::uint16_t> half = {0x3C00, 0xC000, 0x7BFF, 0x0001};
  const std::vector<std::uint16_t> brain = {0x3F80, 0x4049};
  const std::vector<std::int64_t> ids = {-1, 0, 9'000'000'000'000LL};
  const std::vector<double> scalar = {3.25};
  const std::vector<std::uint8_t> nothing;
  const std::vector<std::uint8_t> flags = {1, 0, 1};
  const std::vector<TensorView> tensors = {
      view("encoder.weight", DType::kF32, {2, 3}, weight),
      view("half", DType::kF16, {4}, half),
      view("brain", DType::kBF16, {1, 2}, brain),
      view("position_ids", DType::kI64, {1, 3}, ids),
      view("scale", DType::kF64, {}, scalar),
      view("empty", DType::kU8, {0, 4}, nothing),
      view("mask", DType::kBool, {3}, flags),
  };
  const std::string bytes = loom::executor::serialize_safetensors(tensors, {{"format", "pt"}});

  // Header length: little-endian, a multiple of 8; the header starts with '{'.
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(header_bytes % 8 == 0);
  CHECK(bytes[8] == '{');
  CHECK(bytes.size() == 8 + header_bytes + 24 + 8 + 4 + 24 + 8 + 0 + 3);

  TempDir dir;
  const std::string path = (dir.path / "model.safetensors").string();
  loom::executor::write_safetensors(path, tensors, {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == bytes);

  for (const SafetensorsFile& file :
       {SafetensorsFile::read(path), SafetensorsFile::parse(bytes, "memory")}) {
    CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
    REQUIRE(file.tensors().size() == tensors.size());
    for (std::size_t i = 1; i < file.tensors().size(); ++i) {
      CHECK(file.tensors()[i - 1].name < file.tensors()[i].name);
    }
    for (const TensorView& expected : tensors) {
      INFO(expected.name);
      const TensorView* got = file.find(expected.name);
      REQUIRE(got != nullptr);
      CHECK(got->dtype == expected.dtype);
      CHECK(got->shape == expected.shape);
      CHECK(bytes_of(*got) == bytes_of(expected));
      // The reference layout aligns each tensor for its type.
      const auto address = reinterpret_cast<std::uintptr_t>(got->data);
      if (got->size_bytes > 0) CHECK(address % loom::executor::element_size(got->dtype) == 0);
    }
    CHECK(file.find("missing") == nullptr);
    const TensorView* half_view = file.find("half");
    REQUIRE(half_view != nullptr);
    std::uint16_t third = 0;
    std::memcpy(&third, half_view->data + 4, 2);
    CHECK(loom::executor::half_to_float(third) == 65504.0F);
  }

  // Tensors of 8-byte types come first, then 4, 2 and 1; by name within a size.
  const SafetensorsFile file = SafetensorsFile::parse(bytes, "memory");
  CHECK(file.find("position_ids")->data < file.find("scale")->data);
  CHECK(file.find("scale")->data < file.find("encoder.weight")->data);
  CHECK(file.find("encoder.weight")->data < file.find("brain")->data);
  CHECK(file.find("brain")->data < file.find("half")->data);
  CHECK(file.find("half")->data < file.find("mask")->data);
}

TEST_CASE("an empty file set and no metadata", "[safetensors]") {
  const std::string bytes = loom::executor::serialize_safetensors({});
  SafetensorsFile file = SafetensorsFile::parse(bytes, "memory");
  CHECK(file.tensors().empty());
  CHECK(file.metadata().empty());
  CHECK(bytes.size() == 16);  // "{}" padded to 8 bytes
}

TEST_CASE("the writer refuses inconsistent views", "[safetensors]") {
  const std::vector<float> values = {1, 2, 3};
  CHECK_THROWS_AS(loom::executor::serialize_safetensors(
                      {view("a", DType::kF32, {3}, values), view("a", DType::kF32, {3}, values)}),
                  std::invalid_argument);
  CHECK_THROWS_AS(loom::executor::serialize_safetensors({view("a", DType::kF32, {2, 2}, values)}),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      loom::executor::serialize_safetensors({view("__metadata__", DType::kF32, {3}, values)}),
      std::invalid_argument);
}

TEST_CASE("half and bfloat16 bit patterns", "[safetensors]") {
  using loom::executor::bfloat16_to_float;
  using loom::executor::half_to_float;
  CHECK(half_to_float(0x3C00) == 1.0F);
  CHECK(half_to_float(0xC000) == -2.0F);
  CHECK(half_to_float(0x7BFF) == 65504.0F);
  CHECK(half_to_float(0x3555) == 0.333251953125F);
  CHECK(half_to_float(0x0400) == std::ldexp(1.0F, -14));  // smallest normal
  CHECK(half_to_float(0x0001) == std::ldexp(1.0F, -24));  // smallest subnormal
  CHECK(half_to_float(0x03FF) == std::ldexp(1023.0F, -24));
  CHECK(half_to_float(0x0000) == 0.0F);
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(half_to_float(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(half_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(half_to_float(0x7E00)));
  CHECK(std::isnan(half_to_float(0x7C01)));
  CHECK(bfloat16_to_float(0x3F80) == 1.0F);
  CHECK(bfloat16_to_float(0xC0A0) == -5.0F);
  CHECK(bfloat16_to_float(0x4049) == 3.140625F);
  CHECK(bfloat16_to_float(0x7F80) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(bfloat16_to_float(0x7FC0)));
}

TEST_CASE("a valid hand-made file with space padding and a zero-length tensor", "[safetensors]") {
  const std::string header = R"({"b":{"dtype":"I8","shape":[2],"data_offsets":[4,6]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[6,6]}})";
  SafetensorsFile file = SafetensorsFile::parse(raw_file(header, 6), "memory");
  REQUIRE(file.tensors().size() == 3);
  CHECK(file.tensors()[0].name == "a");
  CHECK(file.find("b")->size_bytes == 2);
  CHECK(file.find("z")->size_bytes == 0);
}

TEST_CASE("broken files are refused, naming the file, the tensor and the expectation",
          "[safetensors]") {
  const std::string w4 = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  SECTION("shorter than the 8-byte length") {
    require_refused(std::string("\x08\0\0", 3), "header", "8 bytes");
  }
  SECTION("header length beyond the file") {
    require_refused(raw_file(w4, 8, 4096), "header", "truncated");
  }
  SECTION("header length above 100 MB") {
    require_refused(raw_file(w4, 8, 100'000'001), "header", "100000000");
  }
  SECTION("header not JSON") { require_refused(raw_file("{\"w\": [1, 2", 0), "header", "JSON"); }
  SECTION("header not an object") { require_refused(raw_file("[1, 2]", 0), "header", "'{'"); }
  SECTION("header not UTF-8") { require_refused(raw_file("{\"\xff\": 1}", 0), "header", "UTF-8"); }
  SECTION("offsets outside the buffer") {
    require_refused(raw_file(w4, 4), "tensor \"w\"", "4-byte buffer");
  }
  SECTION("size differs from the shape") {
    require_refused(raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                    "tensor \"w\"", "12 bytes");
  }
  SECTION("unknown dtype") {
    require_refused(raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", 8),
                    "tensor \"w\"", "F32");
  }
  SECTION("negative dimension") {
    require_refused(raw_file(R"({"w":{"dtype":"U8","shape":[-8],"data_offsets":[0,8]}})", 8),
                    "tensor \"w\"", "non-negative");
  }
  SECTION("fractional dimension") {
    require_refused(raw_file(R"({"w":{"dtype":"U8","shape":[8.0],"data_offsets":[0,8]}})", 8),
                    "tensor \"w\"", "integers");
  }
  SECTION("begin after end") {
    require_refused(raw_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
                    "tensor \"w\"", "begin <= end");
  }
  SECTION("missing data_offsets") {
    require_refused(raw_file(R"({"w":{"dtype":"U8","shape":[8]}})", 8), "tensor \"w\"",
                    "data_offsets");
  }
  SECTION("a hole between tensors") {
    require_refused(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                             10),
                    "tensor \"b\"", "hole");
  }
  SECTION("overlapping tensors") {
    require_refused(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                             6),
                    "tensor \"b\"", "overlap");
  }
  SECTION("bytes after the last tensor") { require_refused(raw_file(w4, 12), "buffer", "cover"); }
  SECTION("the same name twice") {
    require_refused(raw_file(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                             8),
                    "tensor \"w\"", "once");
  }
  SECTION("metadata that is not strings") {
    require_refused(raw_file(R"({"__metadata__":{"epoch":3}})", 0), "__metadata__.epoch",
                    "a string");
  }
  SECTION("an entry that is not an object") {
    require_refused(raw_file(R"({"w":[0,8]})", 8), "tensor \"w\"", "dtype");
  }
}

TEST_CASE("missing files and folders are refused", "[safetensors]") {
  TempDir dir;
  const std::string missing = (dir.path / "none.safetensors").string();
  CHECK_THROWS_WITH(SafetensorsFile::read(missing),
                    Catch::Contains(missing) && Catch::Contains("cannot read"));
  CHECK_THROWS_WITH(SafetensorsFile::read(dir.path.string()), Catch::Contains("directory"));
}
