#include "colibri/model/gguf.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "model/file_io.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::model {

namespace fs = std::filesystem;

namespace {

// GGML's names for the types colibri has no traits for (llama.cpp's i-quants among them), so that an error can name
// the type a quantizer chose (IQ4_NL is its fallback for rows that k-quants do not fit).
std::string ggml_type_name(std::uint32_t id) {
  static const std::pair<std::uint32_t, const char*> kNames[] = {
      {9, "q8_1"},   {15, "q8_k"},  {16, "iq2_xxs"}, {17, "iq2_xs"}, {18, "iq3_xxs"}, {19, "iq1_s"}, {20, "iq4_nl"},
      {21, "iq3_s"}, {22, "iq2_s"}, {23, "iq4_xs"},  {29, "iq1_m"},  {34, "tq1_0"},   {35, "tq2_0"}};
  for (const auto& [known, name] : kNames) {
    if (known == id) return std::string(name) + " (id " + std::to_string(id) + ")";
  }
  return "id " + std::to_string(id);
}

// What a header that runs past the end of the file means, and what to do.
constexpr const char* kCut = "the file is truncated or damaged (an interrupted download?): re-download it";

// A name from the file as it can be shown in an error: control bytes and bytes that are not UTF-8 as \xNN (a corrupt
// key would otherwise print raw bytes into the terminal), and at most 120 bytes.
std::string shown(std::string_view name) {
  std::string out;
  std::size_t i = 0;
  for (; i < name.size() && out.size() < 120;) {
    const auto c = static_cast<unsigned char>(name[i]);
    const std::size_t n = c >= 0x80 ? tokenizer::utf8::valid_sequence_length(name, i) : 1;
    if (c >= 0x80 && n > 0) {
      out.append(name.substr(i, n));
      i += n;
      continue;
    }
    if (c < 0x20 || c == 0x7f || c >= 0x80) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  if (i < name.size()) out += "...";
  return out;
}

}  // namespace
using sdk::Status;
using sdk::StatusCode;

const char* to_string(GgufType t) noexcept {
  switch (t) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const noexcept {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64: return true;
    default: return false;
  }
}

std::size_t GgufValue::array_size() const noexcept {
  return std::visit(
      [](const auto& x) -> std::size_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::vector<std::int64_t>> || std::is_same_v<T, std::vector<double>> ||
                      std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<bool>> ||
                      std::is_same_v<T, std::vector<GgufValue>>) {
          return x.size();
        } else {
          return 0;
        }
      },
      v);
}

struct GgufFile::Impl {
  std::vector<io::File> files;  // one per part
};

namespace {

constexpr std::uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr int kMaxNesting = 4;

// Sequential reader over the header with a window buffer; every read is checked against the file size.
class HeaderReader {
 public:
  HeaderReader(const io::File& f, std::uint64_t size) : file_(f), size_(size) {}

  [[nodiscard]] std::uint64_t pos() const { return pos_; }
  [[nodiscard]] std::uint64_t remaining() const { return size_ - pos_; }

  Status bytes(void* dst, std::size_t n, const std::string& what) {
    if (n > remaining()) {
      return Status(StatusCode::corrupt_data, io::path_text(file_.path()) + ": " + what + " at byte " +
                                                  std::to_string(pos_) + " runs past the end of the file (" +
                                                  std::to_string(size_) + " bytes); truncated or not GGUF");
    }
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_.size()) {
        buf_start_ = pos_;
        std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(1 << 20, size_ - pos_));
        buf_.resize(want);
        if (auto s = file_.read_at(buf_.data(), want, pos_); !s) return s;
      }
      std::size_t in_buf = static_cast<std::size_t>(buf_start_ + buf_.size() - pos_);
      std::size_t take = std::min(in_buf, n);
      std::memcpy(out, buf_.data() + (pos_ - buf_start_), take);
      out += take;
      n -= take;
      pos_ += take;
    }
    return {};
  }

  template <typename T>
  Status pod(T& v, const std::string& what) {
    return bytes(&v, sizeof(T), what);  // GGUF is little endian, as is every host colibri runs on
  }

  Status string(std::string& s, const std::string& what) {
    std::uint64_t n = 0;
    if (auto st = pod(n, what + " length"); !st) return st;
    if (n > remaining()) {
      return Status(StatusCode::corrupt_data, io::path_text(file_.path()) + ": " + what + " claims " +
                                                  std::to_string(n) + " bytes, more than the rest of the file; " +
                                                  kCut);
    }
    s.resize(static_cast<std::size_t>(n));
    return bytes(s.data(), s.size(), what);
  }

 private:
  const io::File& file_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  std::uint64_t buf_start_ = 0;
  std::vector<char> buf_;
};

std::size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64: return 8;
    case GgufType::string: return 8;  // at least the length
    case GgufType::array: return 12;  // at least type + count
  }
  return 0;
}

Status read_scalar_int(HeaderReader& r, GgufType t, std::int64_t& out, const std::string& what) {
  switch (t) {
    case GgufType::u8: {
      std::uint8_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    case GgufType::i8: {
      std::int8_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    case GgufType::u16: {
      std::uint16_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    case GgufType::i16: {
      std::int16_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    case GgufType::u32: {
      std::uint32_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    case GgufType::i32: {
      std::int32_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    case GgufType::u64: {
      std::uint64_t v;
      auto s = r.pod(v, what);
      out = static_cast<std::int64_t>(v);
      return s;
    }
    case GgufType::i64: {
      std::int64_t v;
      auto s = r.pod(v, what);
      out = v;
      return s;
    }
    default: return Status(StatusCode::internal, "not an integer type");
  }
}

Status read_value(HeaderReader& r, GgufType type, GgufValue& out, const std::string& what, int depth,
                  const fs::path& path) {
  out.type = type;
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64: {
      std::int64_t v = 0;
      if (auto s = read_scalar_int(r, type, v, what); !s) return s;
      out.v = v;
      return {};
    }
    case GgufType::f32: {
      float f;
      if (auto s = r.pod(f, what); !s) return s;
      out.v = static_cast<double>(f);
      return {};
    }
    case GgufType::f64: {
      double d;
      if (auto s = r.pod(d, what); !s) return s;
      out.v = d;
      return {};
    }
    case GgufType::boolean: {
      std::uint8_t b;
      if (auto s = r.pod(b, what); !s) return s;
      if (b > 1)
        return Status(StatusCode::corrupt_data,
                      io::path_text(path) + ": " + what + " is a bool of value " + std::to_string(b));
      out.v = b != 0;
      return {};
    }
    case GgufType::string: {
      std::string s;
      if (auto st = r.string(s, what); !st) return st;
      out.v = std::move(s);
      return {};
    }
    case GgufType::array: {
      if (depth >= kMaxNesting)
        return Status(StatusCode::corrupt_data, io::path_text(path) + ": " + what + " nests arrays too deeply");
      std::uint32_t et = 0;
      std::uint64_t n = 0;
      if (auto s = r.pod(et, what + " element type"); !s) return s;
      if (et > static_cast<std::uint32_t>(GgufType::f64)) {
        return Status(StatusCode::corrupt_data,
                      io::path_text(path) + ": " + what + " has unknown element type " + std::to_string(et));
      }
      if (auto s = r.pod(n, what + " count"); !s) return s;
      auto elem = static_cast<GgufType>(et);
      out.elem_type = elem;
      if (n > r.remaining() / scalar_size(elem)) {
        return Status(StatusCode::corrupt_data, io::path_text(path) + ": " + what + " claims " + std::to_string(n) +
                                                    " elements, more than the rest of the file holds; " + kCut);
      }
      switch (elem) {
        case GgufType::string: {
          std::vector<std::string> v(static_cast<std::size_t>(n));
          for (auto& s : v) {
            if (auto st = r.string(s, what + " element"); !st) return st;
          }
          out.v = std::move(v);
          return {};
        }
        case GgufType::f32:
        case GgufType::f64: {
          std::vector<double> v(static_cast<std::size_t>(n));
          for (auto& d : v) {
            GgufValue x;
            if (auto st = read_value(r, elem, x, what, depth + 1, path); !st) return st;
            d = std::get<double>(x.v);
          }
          out.v = std::move(v);
          return {};
        }
        case GgufType::boolean: {
          std::vector<bool> v(static_cast<std::size_t>(n));
          for (std::size_t i = 0; i < v.size(); ++i) {
            GgufValue x;
            if (auto st = read_value(r, elem, x, what, depth + 1, path); !st) return st;
            v[i] = std::get<bool>(x.v);
          }
          out.v = std::move(v);
          return {};
        }
        case GgufType::array: {
          std::vector<GgufValue> v(static_cast<std::size_t>(n));
          for (auto& x : v) {
            if (auto st = read_value(r, elem, x, what, depth + 1, path); !st) return st;
          }
          out.v = std::move(v);
          return {};
        }
        default: {
          std::vector<std::int64_t> v(static_cast<std::size_t>(n));
          for (auto& i : v) {
            if (auto st = read_scalar_int(r, elem, i, what); !st) return st;
          }
          out.v = std::move(v);
          return {};
        }
      }
    }
  }
  return Status(StatusCode::corrupt_data, io::path_text(path) + ": " + what + " has unknown value type " +
                                              std::to_string(static_cast<std::uint32_t>(type)));
}

}  // namespace

sdk::Expected<GgufFile> GgufFile::open(const fs::path& path) {
  auto g = open_one(path);
  if (!g) return g;
  const auto* count = g->find("split.count");
  if (count == nullptr) return g;
  if (!count->is_integer() || std::get<std::int64_t>(count->v) < 1 || std::get<std::int64_t>(count->v) > 99999) {
    return Status(StatusCode::corrupt_data, io::path_text(path) + ": metadata split.count is not a part count");
  }
  if (std::get<std::int64_t>(count->v) == 1) return g;
  return join_parts(std::move(*g));
}

namespace {
std::string part_suffix(std::int64_t part, std::int64_t count) {
  char out[64];
  std::snprintf(out, sizeof out, "-%05lld-of-%05lld.gguf", static_cast<long long>(part), static_cast<long long>(count));
  return out;
}
}  // namespace

// llama-gguf-split names part i of n PREFIX-0000i-of-0000n.gguf; every part holds split.no (0-based) and
// split.count, the first all the metadata and split.tensors.count.
sdk::Expected<GgufFile> GgufFile::join_parts(GgufFile given) {
  const std::int64_t count = *given.get_int("split.count");
  const auto no = given.get_int("split.no");
  const std::string given_text = io::path_text(given.path_);
  auto bad = [](const std::string& what) { return Status(StatusCode::corrupt_data, what); };
  if (!no || *no < 0 || *no >= count) {
    return bad(given_text + ": metadata split.no is missing or not below split.count " + std::to_string(count));
  }
  const std::string name = given.path_.filename().string();
  // PREFIX-NNNNN-of-MMMMM.gguf, parsed by hand: std::regex trips GCC 12's -Wmaybe-uninitialized under ASan.
  auto five_digits = [&](std::size_t at) -> std::int64_t {
    std::int64_t v = 0;
    for (std::size_t i = at; i < at + 5; ++i) {
      if (name[i] < '0' || name[i] > '9') return -1;
      v = v * 10 + (name[i] - '0');
    }
    return v;
  };
  constexpr std::size_t kTail = sizeof("-00001-of-00003.gguf") - 1;
  const bool named = name.size() > kTail && name.ends_with(".gguf") && name[name.size() - kTail] == '-' &&
                     name.compare(name.size() - kTail + 6, 4, "-of-") == 0 &&
                     five_digits(name.size() - kTail + 1) == *no + 1 && five_digits(name.size() - kTail + 10) == count;
  const std::string of = "part " + std::to_string(*no + 1) + " of " + std::to_string(count) + " of a split GGUF";
  if (!named) {
    const std::string want = part_suffix(*no + 1, count);
    return Status(StatusCode::invalid_argument,
                  given_text + " is " + of + ", but its name does not end in '" + want +
                      "' (llama-gguf-split's naming), so its other parts cannot be found: give the parts their "
                      "original names, or merge them (llama-gguf-split --merge FIRST-PART.gguf MERGED.gguf)");
  }
  const fs::path dir = given.path_.parent_path();
  const std::string prefix = name.substr(0, name.size() - kTail);

  std::vector<GgufFile> parts;
  for (std::int64_t i = 0; i < count; ++i) {
    if (i == *no) {
      parts.push_back(std::move(given));
      continue;
    }
    const fs::path p = dir / (prefix + part_suffix(i + 1, count));
    std::error_code ec;
    if (!fs::exists(p, ec)) {
      return Status(StatusCode::not_found, given_text + " is " + of + "; part " + std::to_string(i + 1) + " (" +
                                               io::path_text(p) + ") is missing: download every part into " +
                                               io::path_text(dir.empty() ? fs::path(".") : dir));
    }
    auto g = open_one(p);
    if (!g) return g.error();
    const auto pno = g->get_int("split.no");
    const auto pcount = g->get_int("split.count");
    if (pno != i || pcount != count) {
      return bad(io::path_text(p) + " says it is part " + (pno ? std::to_string(*pno + 1) : "?") + " of " +
                 (pcount ? std::to_string(*pcount) : "?") + ", not part " + std::to_string(i + 1) + " of " +
                 std::to_string(count) + " (parts of two different downloads?): download the parts again");
    }
    parts.push_back(std::move(*g));
  }

  GgufFile all = std::move(parts[0]);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    GgufFile& part = parts[i];
    all.parts_.push_back(part.path_);
    all.impl_->files.push_back(std::move(part.impl_->files[0]));
    for (auto& t : part.tensors_) {
      if (auto it = all.tensor_index_.find(t.name); it != all.tensor_index_.end()) {
        return bad("tensor '" + shown(t.name) + "' is in both " +
                   io::path_text(all.parts_[all.tensors_[it->second].part]) + " and " + io::path_text(part.path_) +
                   ": the parts do not belong together (one from another download or another split of the model, "
                   "or damaged); download every part again from one place");
      }
      t.part = static_cast<std::uint32_t>(i);
      all.tensor_index_[t.name] = all.tensors_.size();
      all.tensors_.push_back(std::move(t));
    }
  }
  if (const auto expected = all.get_int("split.tensors.count");
      expected && *expected != static_cast<std::int64_t>(all.tensors_.size())) {
    return bad(io::path_text(all.path_) + ": the first part says the split GGUF holds " + std::to_string(*expected) +
               " tensors, its " + std::to_string(count) + " parts hold " + std::to_string(all.tensors_.size()) +
               "; download the parts again");
  }
  return all;
}

sdk::Expected<GgufFile> GgufFile::open_one(const fs::path& path) {
  auto f = io::File::open_read(path);
  if (!f) return f.error();
  auto size = f->size();
  if (!size) return size.error();
  GgufFile g;
  g.path_ = path;
  g.parts_ = {path};
  g.impl_ = std::make_shared<Impl>();
  g.impl_->files.push_back(std::move(*f));
  const std::string file = io::path_text(path);
  auto bad = [&](const std::string& what) { return Status(StatusCode::corrupt_data, file + ": " + what); };

  HeaderReader r(g.impl_->files[0], *size);
  char magic[4];
  if (auto s = r.bytes(magic, 4, "magic"); !s) return s;
  if (std::memcmp(magic, "GGUF", 4) != 0) return bad("not a GGUF file (magic is not 'GGUF')");
  if (auto s = r.pod(g.version_, "version"); !s) return s;
  if (g.version_ != 2 && g.version_ != 3) {
    return bad("GGUF version " + std::to_string(g.version_) + " is not supported (colibri reads versions 2 and 3)");
  }
  std::uint64_t n_tensors = 0, n_kv = 0;
  if (auto s = r.pod(n_tensors, "tensor count"); !s) return s;
  if (auto s = r.pod(n_kv, "metadata count"); !s) return s;
  // Each entry takes at least 12 (metadata) or 24 (tensor info) bytes: counts that do not fit what is left mean a file
  // cut short (the usual case: an interrupted download) or a damaged header.
  if (n_kv > r.remaining() / 12 || n_tensors > r.remaining() / 24) {
    return bad("the header lists " + std::to_string(n_kv) + " metadata entries and " + std::to_string(n_tensors) +
               " tensors, more than the " + std::to_string(r.remaining()) + " bytes left in the file can hold; " +
               kCut);
  }

  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    if (auto s = r.string(key, "metadata key #" + std::to_string(i)); !s) return s;
    std::uint32_t t = 0;
    if (auto s = r.pod(t, "type of metadata '" + shown(key) + "'"); !s) return s;
    if (t > static_cast<std::uint32_t>(GgufType::f64)) {
      return bad("metadata '" + shown(key) + "' has unknown value type " + std::to_string(t));
    }
    GgufValue v;
    if (auto s = read_value(r, static_cast<GgufType>(t), v, "metadata '" + shown(key) + "'", 0, path); !s) return s;
    if (g.metadata_.count(key)) return bad("metadata key '" + shown(key) + "' appears twice");
    g.metadata_.emplace(std::move(key), std::move(v));
  }
  if (const auto* a = g.find("general.alignment")) {
    if (!a->is_integer()) return bad("general.alignment must be an integer");
    auto al = std::get<std::int64_t>(a->v);
    if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 20)) {
      return bad("general.alignment " + std::to_string(al) + " is not a power of two");
    }
    g.alignment_ = static_cast<std::uint64_t>(al);
  }

  struct Raw {
    std::string name;
    std::vector<std::int64_t> ne;
    std::uint32_t type;
    std::uint64_t offset;
  };
  std::vector<Raw> raws;
  raws.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    Raw t;
    if (auto s = r.string(t.name, "tensor name #" + std::to_string(i)); !s) return s;
    const std::string where = "tensor '" + shown(t.name) + "'";
    std::uint32_t n_dims = 0;
    if (auto s = r.pod(n_dims, where + " dimension count"); !s) return s;
    if (n_dims == 0 || n_dims > kMaxDims)
      return bad(where + " has " + std::to_string(n_dims) + " dimensions (1..4 allowed)");
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      std::uint64_t ne = 0;
      if (auto s = r.pod(ne, where + " shape"); !s) return s;
      if (ne == 0 || ne > (1ull << 40)) return bad(where + " has dimension " + std::to_string(ne));
      t.ne.push_back(static_cast<std::int64_t>(ne));
    }
    if (auto s = r.pod(t.type, where + " type"); !s) return s;
    if (auto s = r.pod(t.offset, where + " offset"); !s) return s;
    raws.push_back(std::move(t));
  }
  std::uint64_t pos = r.pos();
  g.data_offset_ = (pos + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  if (g.data_offset_ > *size) {
    // A vocab-only file may end right after its header, without alignment padding.
    if (!raws.empty()) return bad(std::string("data section starts past the end of the file; ") + kCut);
    g.data_offset_ = *size;
  }
  const std::uint64_t data_len = *size - g.data_offset_;

  for (auto& raw : raws) {
    const std::string where = "tensor '" + shown(raw.name) + "'";
    const auto* traits = sdk::dtype_traits_by_id(raw.type);
    if (traits == nullptr) {
      return bad(where + " has GGML type " + ggml_type_name(raw.type) +
                 ", which colibri does not know; re-export it as f16, bf16, q8_0, q4_0 or q2_k..q6_k");
    }
    if (raw.ne[0] % traits->block_elems != 0) {
      return bad(where + " has rows of " + std::to_string(raw.ne[0]) + " elements, not a multiple of the " +
                 std::string(traits->name) + " block size " + std::to_string(traits->block_elems));
    }
    std::uint64_t bytes = sdk::row_bytes(traits->type, raw.ne[0]);
    for (std::size_t d = 1; d < raw.ne.size(); ++d) {
      if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(raw.ne[d]), &bytes))
        return bad(where + " is too large");
    }
    if (raw.offset % g.alignment_ != 0) {
      return bad(where + " data offset " + std::to_string(raw.offset) + " is not a multiple of the alignment " +
                 std::to_string(g.alignment_));
    }
    if (raw.offset > data_len || bytes > data_len - raw.offset) {
      return bad(where + " data [" + std::to_string(raw.offset) + ", +" + std::to_string(bytes) +
                 ") runs past the end of the file; the file is truncated");
    }
    if (g.tensor_index_.count(raw.name)) return bad(where + " appears twice");
    GgufTensorInfo info;
    info.name = raw.name;
    info.ne = raw.ne;
    info.type = traits->type;
    info.offset = g.data_offset_ + raw.offset;
    info.size = bytes;
    g.tensor_index_[info.name] = g.tensors_.size();
    g.tensors_.push_back(std::move(info));
  }
  // Writers give every tensor its own bytes; data shared between two tensors means a damaged index, and
  // converting it would silently give two weights the same values.
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : g.tensors_) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto& a = *by_offset[i - 1];
    const auto& b = *by_offset[i];
    if (b.offset - a.offset < a.size) {  // sorted and both in bounds: no overflow
      return bad("tensor '" + shown(b.name) + "' data [" + std::to_string(b.offset - g.data_offset_) + ", +" +
                 std::to_string(b.size) + ") overlaps tensor '" + shown(a.name) + "' [" +
                 std::to_string(a.offset - g.data_offset_) + ", +" + std::to_string(a.size) +
                 "); the file's tensor index is damaged, re-export it");
    }
  }
  return g;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::int64_t> GgufFile::get_int(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || !v->is_integer()) return std::nullopt;
  return std::get<std::int64_t>(v->v);
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_float()) return std::get<double>(v->v);
  if (v->is_integer()) return static_cast<double>(std::get<std::int64_t>(v->v));
  return std::nullopt;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->type != GgufType::boolean) return std::nullopt;
  return std::get<bool>(v->v);
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->type != GgufType::string) return std::nullopt;
  return std::get<std::string>(v->v);
}

Status GgufFile::read(const GgufTensorInfo& t, std::uint64_t offset, void* dst, std::size_t n) const {
  if (offset > t.size || n > t.size - offset) {
    return Status(StatusCode::invalid_argument, "read past the end of tensor '" + t.name + "'");
  }
  return impl_->files.at(t.part).read_at(dst, n, t.offset + offset);
}

}  // namespace colibri::model
