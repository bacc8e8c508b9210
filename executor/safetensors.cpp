#include "executor/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {

static_assert(std::endian::native == std::endian::little,
              "safetensors data are little-endian; a big-endian host would need byte swaps");

namespace {

using nlohmann::json;

constexpr std::size_t kLengthBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
  std::size_t size;
};

constexpr DTypeName kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

const DTypeName& info(DType dtype) {
  for (const DTypeName& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  throw std::logic_error("unknown DType value");
}

std::string supported_dtypes() {
  std::string out;
  for (const DTypeName& entry : kDTypes) out += (out.empty() ? "" : " ") + std::string(entry.name);
  return out;
}

std::string tensor_path(const std::string& name) { return "tensor \"" + name + "\""; }

std::uint64_t read_u64_le(const unsigned char* bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) {
    value |= static_cast<std::uint64_t>(bytes[i]) << (8U * i);
  }
  return value;
}

void append_u64_le(std::string& out, std::uint64_t value) {
  for (std::size_t i = 0; i < kLengthBytes; ++i) {
    out += static_cast<char>((value >> (8U * i)) & 0xFFU);
  }
}

// Checks the header length against the file size; both come from the first 8 bytes and the file.
void check_header_length(std::uint64_t header_bytes, std::uint64_t file_bytes,
                         const std::string& source) {
  if (header_bytes > SafetensorsFile::kMaxHeaderBytes) {
    throw InputError(source, "header",
                     "a header length of at most " +
                         std::to_string(SafetensorsFile::kMaxHeaderBytes) + " bytes, found " +
                         std::to_string(header_bytes));
  }
  if (header_bytes > file_bytes - kLengthBytes) {
    throw InputError(source, "header",
                     "a header of " + std::to_string(header_bytes) +
                         " bytes within the file, but " +
                         std::to_string(file_bytes - kLengthBytes) +
                         " bytes follow the length (truncated file?)");
  }
}

// A non-negative JSON integer, or InputError at `path`.
std::uint64_t unsigned_integer(const json& value, const std::string& source,
                               const std::string& path, const char* what) {
  if (!value.is_number_unsigned()) {
    throw InputError(source, path,
                     std::string(what) + " must be non-negative integers, found " + value.dump());
  }
  return value.get<std::uint64_t>();
}

struct Entry {
  TensorView view;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

Entry read_entry(const std::string& name, const json& value, const std::string& source) {
  const std::string path = tensor_path(name);
  if (!value.is_object()) {
    throw InputError(source, path,
                     "an object {\"dtype\", \"shape\", \"data_offsets\"}, found " +
                         std::string(value.type_name()));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key))
      throw InputError(source, path, std::string("a \"") + key + "\" field");
  }
  Entry entry;
  entry.view.name = name;
  const json& dtype = value.at("dtype");
  if (!dtype.is_string() || !dtype_from_string(dtype.get<std::string>(), entry.view.dtype)) {
    throw InputError(source, path,
                     "a dtype among " + supported_dtypes() + ", found " + dtype.dump());
  }
  const json& shape = value.at("shape");
  if (!shape.is_array()) throw InputError(source, path, "a shape that is an array of integers");
  std::uint64_t count = 1;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (const json& dim : shape) {
    std::uint64_t size = unsigned_integer(dim, source, path, "shape dimensions");
    if (size > kMax || (size != 0 && count > kMax / size)) {
      throw InputError(source, path, "a shape whose element count fits in 63 bits");
    }
    count *= size;
    entry.view.shape.push_back(static_cast<std::int64_t>(size));
  }
  const json& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    throw InputError(source, path, "data_offsets [begin, end], found " + offsets.dump());
  }
  entry.begin = unsigned_integer(offsets[0], source, path, "data_offsets");
  entry.end = unsigned_integer(offsets[1], source, path, "data_offsets");
  if (entry.end < entry.begin) {
    throw InputError(source, path, "data_offsets with begin <= end, found " + offsets.dump());
  }
  const std::size_t element_bytes = element_size(entry.view.dtype);
  if (count > kMax / element_bytes) {
    throw InputError(source, path, "a shape whose size in bytes fits in 63 bits");
  }
  if (entry.end - entry.begin != count * element_bytes) {
    throw InputError(source, path,
                     std::to_string(count) + " elements of " + to_string(entry.view.dtype) + " (" +
                         std::to_string(count * element_bytes) +
                         " bytes) for its shape, but data_offsets " + offsets.dump() + " hold " +
                         std::to_string(entry.end - entry.begin) + " bytes");
  }
  return entry;
}

}  // namespace

std::size_t element_size(DType dtype) { return info(dtype).size; }

std::string to_string(DType dtype) { return info(dtype).name; }

bool dtype_from_string(std::string_view name, DType& dtype) {
  for (const DTypeName& entry : kDTypes) {
    if (name == entry.name) {
      dtype = entry.dtype;
      return true;
    }
  }
  return false;
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) count *= size;
  return count;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(path, "", "expected a safetensors file, found a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path, "", std::string("cannot read file (") + std::strerror(errno) + ")");
  }
  in.seekg(0, std::ios::end);
  const std::streamoff file_size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (!in || file_size < 0) throw InputError(path, "", "a readable file of known size");
  const auto file_bytes = static_cast<std::uint64_t>(file_size);
  if (file_bytes < kLengthBytes) {
    throw InputError(path, "header",
                     "at least 8 bytes (the header length), found " + std::to_string(file_bytes));
  }
  unsigned char length[kLengthBytes];
  in.read(reinterpret_cast<char*>(length), kLengthBytes);
  const std::uint64_t header_bytes = read_u64_le(length);
  check_header_length(header_bytes, file_bytes, path);
  std::string header(header_bytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_bytes));
  auto buffer = std::make_shared<std::vector<std::byte>>(file_bytes - kLengthBytes - header_bytes);
  in.read(reinterpret_cast<char*>(buffer->data()), static_cast<std::streamsize>(buffer->size()));
  if (!in) throw InputError(path, "", "a file that can be read to its end");

  SafetensorsFile file;
  file.source_ = path;
  file.buffer_ = std::move(buffer);
  file.parse_header(header);
  return file;
}

SafetensorsFile SafetensorsFile::parse(std::string_view bytes, const std::string& source) {
  if (bytes.size() < kLengthBytes) {
    throw InputError(source, "header",
                     "at least 8 bytes (the header length), found " + std::to_string(bytes.size()));
  }
  const std::uint64_t header_bytes =
      read_u64_le(reinterpret_cast<const unsigned char*>(bytes.data()));
  check_header_length(header_bytes, bytes.size(), source);
  const std::string_view rest = bytes.substr(kLengthBytes + header_bytes);
  auto buffer = std::make_shared<std::vector<std::byte>>(rest.size());
  if (!rest.empty()) std::memcpy(buffer->data(), rest.data(), rest.size());

  SafetensorsFile file;
  file.source_ = source;
  file.buffer_ = std::move(buffer);
  file.parse_header(std::string(bytes.substr(kLengthBytes, header_bytes)));
  return file;
}

void SafetensorsFile::parse_header(const std::string& header) {
  const std::string& source = source_;
  if (header.empty() || header.front() != '{') {
    throw InputError(source, "header", "a JSON object starting with '{'");
  }
  std::set<std::string> names;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
      if (!names.insert(parsed.get<std::string>()).second) duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json root;
  try {
    root = json::parse(header, on_event);
  } catch (const json::exception& e) {
    throw InputError(source, "header", std::string("valid UTF-8 JSON (") + e.what() + ")");
  }
  if (!root.is_object()) throw InputError(source, "header", "a JSON object");
  if (!duplicate.empty()) {
    throw InputError(source, tensor_path(duplicate), "a name that appears once in the header");
  }

  std::vector<Entry> entries;
  for (const auto& [name, value] : root.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) throw InputError(source, kMetadataKey, "an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          throw InputError(source, std::string(kMetadataKey) + "." + key,
                           "a string, found " + text.dump());
        }
        metadata_.emplace(key, text.get<std::string>());
      }
      continue;
    }
    entries.push_back(read_entry(name, value, source));
  }

  // The tensors must tile the buffer: sorted by offsets, each begins where the previous ended.
  std::vector<const Entry*> by_offset;
  by_offset.reserve(entries.size());
  for (const Entry& entry : entries) by_offset.push_back(&entry);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  const std::uint64_t buffer_bytes = buffer_->size();
  std::uint64_t covered = 0;
  std::string previous = "the start of the buffer";
  for (const Entry* entry : by_offset) {
    const std::string path = tensor_path(entry->view.name);
    if (entry->end > buffer_bytes) {
      throw InputError(source, path,
                       "data_offsets within the " + std::to_string(buffer_bytes) +
                           "-byte buffer, found end " + std::to_string(entry->end));
    }
    if (entry->begin < covered) {
      throw InputError(source, path,
                       "data that do not overlap another tensor's: begins at " +
                           std::to_string(entry->begin) + ", before the end of " + previous +
                           " at " + std::to_string(covered));
    }
    if (entry->begin > covered) {
      throw InputError(source, path,
                       "data that begin where " + previous + " ends (" + std::to_string(covered) +
                           "), found " + std::to_string(entry->begin) + ": a hole in the buffer");
    }
    covered = entry->end;
    previous = "tensor \"" + entry->view.name + "\"";
  }
  if (covered != buffer_bytes) {
    throw InputError(source, "buffer",
                     "tensors that cover the " + std::to_string(buffer_bytes) +
                         "-byte buffer, but they end at " + std::to_string(covered));
  }

  tensors_.reserve(entries.size());
  for (Entry& entry : entries) {
    entry.view.data = buffer_->data() + entry.begin;
    entry.view.size_bytes = static_cast<std::size_t>(entry.end - entry.begin);
    tensors_.push_back(std::move(entry.view));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::string serialize_safetensors(const std::vector<TensorView>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const TensorView& t : tensors) {
    if (t.name == kMetadataKey || !names.insert(t.name).second) {
      throw std::invalid_argument("safetensors: tensor name \"" + t.name +
                                  "\" is reserved or used twice");
    }
    for (std::int64_t size : t.shape) {
      if (size < 0) throw std::invalid_argument("safetensors: negative dimension in " + t.name);
    }
    const auto expected = static_cast<std::size_t>(element_count(t.shape)) * element_size(t.dtype);
    if (t.size_bytes != expected || (t.size_bytes > 0 && t.data == nullptr)) {
      throw std::invalid_argument("safetensors: tensor \"" + t.name + "\" has " +
                                  std::to_string(t.size_bytes) + " bytes, its shape needs " +
                                  std::to_string(expected));
    }
  }
  std::vector<const TensorView*> order;
  order.reserve(tensors.size());
  for (const TensorView& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    const std::size_t sa = element_size(a->dtype);
    const std::size_t sb = element_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::uint64_t offset = 0;
  for (const TensorView* t : order) {
    header[t->name] = {{"dtype", to_string(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->size_bytes}}};
    offset += t->size_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(kLengthBytes + text.size() + offset);
  append_u64_le(out, text.size());
  out += text;
  for (const TensorView* t : order) {
    if (t->size_bytes > 0) out.append(reinterpret_cast<const char*>(t->data), t->size_bytes);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  profiles::write_file_atomically(path, serialize_safetensors(tensors, metadata));
}

float half_to_float(std::uint16_t bits) {
  const bool negative = (bits & 0x8000U) != 0;
  const std::uint32_t exponent = (bits >> 10U) & 0x1FU;
  const std::uint32_t mantissa = bits & 0x3FFU;
  float value = 0.0F;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 0x1F) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity()
                          : std::bit_cast<float>(0x7FC00000U | (mantissa << 13U));
  } else {
    value = std::bit_cast<float>(((exponent + 112U) << 23U) | (mantissa << 13U));
  }
  return negative ? -value : value;
}

float bfloat16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16U);
}

}  // namespace loom::executor
