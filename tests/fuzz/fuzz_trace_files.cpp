// Files a user hands to `colibri-cli ab` (a JSONL routing trace, or a CSV or JSON one to import) and the expert usage
// history colibri keeps on disk (which a crash or a full disk may have damaged). The first byte picks the reader.
// A trace that reads back is written and read again: the records must come back the same.
#include <string>

#include "colibri/ab/trace.hpp"
#include "colibri/engine/usage_history.hpp"
#include "fuzz_common.hpp"

namespace {

bool same(const std::vector<colibri::ab::TraceRecord>& a, const std::vector<colibri::ab::TraceRecord>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (colibri::ab::to_jsonl(a[i]) != colibri::ab::to_jsonl(b[i])) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  fuzz::Input in(data, size);
  const std::uint8_t which = in.byte();
  const std::string_view body = in.rest();
  sdk::Expected<std::vector<ab::TraceRecord>> records = sdk::Status(sdk::StatusCode::invalid_argument, "unread");
  switch (which % 4) {
    case 0: records = ab::read_trace(fuzz::write_scratch("trace.jsonl", body)); break;
    case 1: records = ab::import_trace(fuzz::write_scratch("trace.csv", body), ab::ImportFormat::csv); break;
    case 2: records = ab::import_trace(fuzz::write_scratch("trace.json", body), ab::ImportFormat::json); break;
    case 3: {
      auto history = engine::load_usage_history(fuzz::write_scratch("usage.json", body));
      if (!history) return 0;
      const auto path = fuzz::write_scratch("saved.json", "");
      FUZZ_CHECK(engine::save_usage_history(path, *history).is_ok(), "a history that was read could not be saved");
      auto again = engine::load_usage_history(path);
      FUZZ_CHECK(again && again->model == history->model && again->counts == history->counts,
                 "a usage history changed when saved and read back");
      return 0;
    }
  }
  if (!records) return 0;
  const auto path = fuzz::write_scratch("written.jsonl", "");
  FUZZ_CHECK(ab::write_trace(path, *records).is_ok(), "a trace that was read could not be written");
  auto again = ab::read_trace(path);
  FUZZ_CHECK(again.has_value(), "a written trace does not read back: " + (again ? "" : again.error().message()));
  FUZZ_CHECK(same(*records, *again), "a trace changed when written and read back");
  return 0;
}
