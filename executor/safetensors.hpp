// Reading and writing the safetensors format (Hugging Face), without LibTorch.
//
// Layout: an unsigned 64-bit little-endian N, then N bytes of UTF-8 JSON (starting with '{',
// possibly padded with spaces), then the byte buffer. The JSON maps each tensor name to
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} with offsets relative to the
// buffer, end exclusive; an optional "__metadata__" maps strings to strings. Data is little-endian
// and row-major.
//
// SafetensorsFile::read checks everything a loader relies on, and throws loom::InputError naming
// the file, the tensor (or "header") and what was expected when the file is shorter than 8 bytes,
// N exceeds kMaxHeaderBytes or the file, the header is not a JSON object or not UTF-8 JSON
// starting with '{', a name appears twice, an entry lacks a field, a dtype is unknown or not
// supported, a shape holds a negative or non-integer value, end - begin differs from the element
// count times the element size, offsets leave the buffer, or the tensors do not cover the buffer
// exactly (a hole or an overlap). Zero-element tensors and rank-0 scalars are allowed.
//
// Tensor data start at the beginning of an allocation of their own (aligned for any type), so a
// tensor whose begin offset is a multiple of its element size is aligned for its type; the
// writer lays tensors out so that this always holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::executor {

// The element types LibTorch can hold (safetensors' U16, U32, U64, C64 and float8 are refused).
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 1, 1.
std::size_t element_size(DType dtype);
// The safetensors name: "F32", "BF16", "BOOL", ...
std::string to_string(DType dtype);
// The dtype of a safetensors name, false when it is not one of the supported ones.
bool dtype_from_string(std::string_view name, DType& dtype);

// Product of the dimensions (1 for a scalar).
std::int64_t element_count(const std::vector<std::int64_t>& shape);

// A tensor's description and bytes; it does not own them.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;
  std::size_t size_bytes = 0;
};

class SafetensorsFile {
 public:
  static constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

  // Reads and checks the whole file (see the top of this header).
  static SafetensorsFile read(const std::string& path);
  // The same for bytes already in memory; `source` names them in errors.
  static SafetensorsFile parse(std::string_view bytes, const std::string& source);

  // Sorted by name; each view points into this object's buffer, which copies share and which
  // lives as long as any of them.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The tensor of that name, or nullptr.
  const TensorView* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }

 private:
  // Checks the JSON header against buffer_ and fills tensors_ and metadata_.
  void parse_header(const std::string& header);

  std::string source_;
  std::shared_ptr<const std::vector<std::byte>> buffer_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The bytes of a safetensors file holding `tensors` (names must be unique and not
// "__metadata__", size_bytes must equal element_count(shape) * element_size(dtype), data non-null
// when size_bytes > 0; std::invalid_argument otherwise). As the reference writer: the header is
// compact JSON padded with spaces so the buffer starts at a multiple of 8, and the data are laid
// out by descending element size, then name, so every tensor is aligned for its type.
std::string serialize_safetensors(const std::vector<TensorView>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// serialize_safetensors() written to `path` atomically (profiles::write_file_atomically).
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// IEEE 754 binary16 and bfloat16 bit patterns to float (exact; subnormals, infinities and NaN
// included).
float half_to_float(std::uint16_t bits);
float bfloat16_to_float(std::uint16_t bits);

}  // namespace loom::executor
