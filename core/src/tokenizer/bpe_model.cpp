// BPE model with HuggingFace's semantics: merges applied by rank over a linked list of symbols with a priority queue
// (O(n log n) per word, so a 100 KB word without spaces stays fast), byte fallback, unk fusing, ignore_merges.
#include <cstdio>
#include <queue>

#include "tokenizer/pipeline.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::tokenizer::detail {
namespace {

constexpr std::size_t kCacheCapacity = 10000;
constexpr std::size_t kMaxCachedWordBytes = 256;

std::uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw ParseError{path, message};
}

std::optional<std::string> optional_string(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) fail(path + "." + key, "expected a string or null");
  return it->get<std::string>();
}

bool optional_bool(const json& j, const char* key, const std::string& path, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(path + "." + key, "expected true or false");
  return it->get<bool>();
}

struct Symbol {
  TokenId id;
  int prev;
  int next;
  std::uint32_t len;  // 0 once merged into its left neighbour
};

struct QueuedMerge {
  std::uint32_t rank;
  int pos;
  TokenId new_id;
  // Lowest rank first, then leftmost position (HF's Merge ordering).
  bool operator<(const QueuedMerge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

BpeModel BpeModel::parse(const json& j, const std::string& path) {
  if (!j.is_object()) fail(path, "expected an object");
  auto type = j.find("type");
  if (type != j.end() && (!type->is_string() || type->get<std::string>() != "BPE")) {
    fail(path + ".type", "unsupported model type " + type->dump() +
                             " (colibri supports \"BPE\"; WordPiece, Unigram and WordLevel are not implemented)");
  }
  if (type == j.end() && !j.contains("merges")) {
    fail(path, "model has no \"type\" and no \"merges\": only BPE models are supported");
  }
  BpeModel m;
  if (auto d = j.find("dropout"); d != j.end() && !d->is_null()) {
    if (!d->is_number()) fail(path + ".dropout", "expected a number or null");
    const double p = d->get<double>();
    if (p < 0.0 || p > 1.0) fail(path + ".dropout", "must be within [0, 1]");
    if (p > 0.0) fail(path + ".dropout", "BPE dropout is a training feature; inference needs dropout null or 0");
  }
  m.unk_token_ = optional_string(j, "unk_token", path);
  m.continuing_subword_prefix_ = optional_string(j, "continuing_subword_prefix", path);
  m.end_of_word_suffix_ = optional_string(j, "end_of_word_suffix", path);
  m.fuse_unk_ = optional_bool(j, "fuse_unk", path, false);
  m.byte_fallback_ = optional_bool(j, "byte_fallback", path, false);
  m.ignore_merges_ = optional_bool(j, "ignore_merges", path, false);

  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object()) fail(path + ".vocab", "missing or not an object of piece -> id");
  m.vocab_.reserve(vocab->size());
  // The id table is indexed by id: a stray huge id would allocate gigabytes. Real vocabularies stay far below this
  // (the largest, Gemma's, has 262k pieces), and gaps in the ids cost memory too.
  constexpr std::int64_t kMaxId = (std::int64_t{1} << 24) - 1;
  TokenId max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<std::int64_t>() < 0) {
      fail(path + ".vocab[" + json(it.key()).dump() + "]", "expected a non-negative integer id");
    }
    if (it.value().get<std::int64_t>() > kMaxId) {
      fail(path + ".vocab[" + json(it.key()).dump() + "]",
           "id " + std::to_string(it.value().get<std::int64_t>()) + " is beyond " + std::to_string(kMaxId) +
               "; ids index a table, so they must stay below the vocabulary's size");
    }
    const auto id = static_cast<TokenId>(it.value().get<std::int64_t>());
    m.vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  m.by_id_.assign(static_cast<std::size_t>(max_id) + 1, nullptr);
  for (const auto& [piece, id] : m.vocab_) m.by_id_[static_cast<std::size_t>(id)] = &piece;

  auto merges = j.find("merges");
  if (merges == j.end() || !merges->is_array()) fail(path + ".merges", "missing or not an array");
  const std::size_t prefix_len = m.continuing_subword_prefix_ ? m.continuing_subword_prefix_->size() : 0;
  m.merges_.reserve(merges->size());
  std::uint32_t rank = 0;
  for (std::size_t i = 0; i < merges->size(); ++i) {
    const json& e = (*merges)[i];
    const std::string where = path + ".merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        fail(where, "legacy merge " + e.dump() + " must be two pieces separated by one space");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail(where, "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = m.vocab_.find(a);
    if (ia == m.vocab_.end()) fail(where, "merge piece " + json(a).dump() + " is not in the vocabulary");
    auto ib = m.vocab_.find(b);
    if (ib == m.vocab_.end()) fail(where, "merge piece " + json(b).dump() + " is not in the vocabulary");
    if (b.size() < prefix_len) fail(where, "merge piece shorter than continuing_subword_prefix");
    const std::string merged = a + b.substr(prefix_len);
    auto im = m.vocab_.find(merged);
    if (im == m.vocab_.end()) fail(where, "merged piece " + json(merged).dump() + " is not in the vocabulary");
    // A repeated pair keeps the last rank, as HF's map construction does.
    m.merges_[pair_key(ia->second, ib->second)] = Merge{rank, im->second};
    ++rank;
  }

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m.vocab_.find(std::string_view(name));
    m.byte_tokens_[static_cast<std::size_t>(b)] = it == m.vocab_.end() ? -1 : it->second;
  }
  if (m.unk_token_ && !m.vocab_.contains(*m.unk_token_)) {
    fail(path + ".unk_token", "unk_token " + json(*m.unk_token_).dump() + " is not in the vocabulary");
  }
  return m;
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view piece) const {
  auto it = vocab_.find(piece);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= by_id_.size()) return nullptr;
  return by_id_[static_cast<std::size_t>(id)];
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(*cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard lock(*cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word),
                   std::vector<TokenId>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](TokenId id, std::size_t len) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, index + 1, static_cast<std::uint32_t>(len)});
  };
  bool have_unk = false;  // a pending run of unknown characters
  TokenId unk_id = 0;
  std::size_t unk_len = 0;
  std::string scratch;
  std::size_t i = 0;
  while (i < word.size()) {
    const std::size_t char_start = i;
    utf8::next_code_point(word, i);
    const bool is_first = char_start == 0;
    const bool is_last = i >= word.size();
    std::string_view piece = word.substr(char_start, i - char_start);
    const std::size_t byte_len = piece.size();
    if ((!is_first && continuing_subword_prefix_) || (is_last && end_of_word_suffix_)) {
      scratch.clear();
      if (!is_first && continuing_subword_prefix_) scratch += *continuing_subword_prefix_;
      scratch += piece;
      if (is_last && end_of_word_suffix_) scratch += *end_of_word_suffix_;
      piece = scratch;
    }
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      if (have_unk) {
        add(unk_id, unk_len);
        have_unk = false;
      }
      add(it->second, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : piece) all = all && byte_tokens_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // HF emits byte tokens without flushing a pending unk first; keep that order.
        for (char c : piece) add(byte_tokens_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_token_) {
      if (have_unk && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (have_unk) add(unk_id, unk_len);
        have_unk = true;
        unk_id = vocab_.find(*unk_token_)->second;
        unk_len = byte_len;
      }
    }
  }
  if (have_unk) add(unk_id, unk_len);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::vector<QueuedMerge> storage;
  storage.reserve(symbols.size());
  std::priority_queue<QueuedMerge> queue(std::less<QueuedMerge>(), std::move(storage));
  for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (auto it = merges_.find(pair_key(symbols[k].id, symbols[k + 1].id)); it != merges_.end()) {
      queue.push(QueuedMerge{it->second.rank, static_cast<int>(k), it->second.new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<std::size_t>(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    const int next_pos = cur.next;
    const Symbol right = symbols[static_cast<std::size_t>(next_pos)];
    // Stale entry: the pair changed since it was queued.
    auto it = merges_.find(pair_key(cur.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[static_cast<std::size_t>(next_pos)].len = 0;
    if (right.next >= 0 && static_cast<std::size_t>(right.next) < symbols.size()) {
      symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    }
    if (cur.prev >= 0) {
      const Symbol& prev = symbols[static_cast<std::size_t>(cur.prev)];
      if (auto m = merges_.find(pair_key(prev.id, cur.id)); m != merges_.end()) {
        queue.push(QueuedMerge{m->second.rank, cur.prev, m->second.new_id});
      }
    }
    if (cur.next >= 0) {
      const Symbol& nxt = symbols[static_cast<std::size_t>(cur.next)];
      if (auto m = merges_.find(pair_key(cur.id, nxt.id)); m != merges_.end()) {
        queue.push(QueuedMerge{m->second.rank, top.pos, m->second.new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace colibri::tokenizer::detail
