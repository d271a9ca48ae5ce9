// Request bodies from the network (the OpenAI API, /tokenize, /detokenize, /admin/cache): the first byte picks the
// parser, the rest is the body. Every body is accepted or refused with an error that names a field; none crashes.
#include <string>
#include <vector>

#include "colibri/server/api.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri::server;
  colibri::fuzz::Input in(data, size);
  const std::uint8_t which = in.byte();
  const std::string_view body = in.rest();
  switch (which % 7) {
    case 0:
    case 1: {
      CompletionRequest request;
      const auto error =
          parse_completion_request(body, which % 2 == 0 ? Endpoint::chat : Endpoint::completions, request);
      if (!error) FUZZ_CHECK(request.n >= 1 && request.n <= kMaxChoices, "n out of range");
      if (!error) FUZZ_CHECK(request.tools.is_null() || request.tools.size() <= kMaxTools, "too many tools");
      break;
    }
    case 2: {
      TokenizeRequest request;
      (void)parse_tokenize_request(body, request);
      break;
    }
    case 3: {
      std::string model;
      std::vector<std::int32_t> tokens;
      (void)parse_detokenize_request(body, model, tokens);
      break;
    }
    case 4: {
      CacheWarmRequest request;
      (void)parse_cache_warm_request(body, request);
      break;
    }
    case 5: (void)parse_cache_clear_request(body); break;
    case 6: {
      (void)parse_expert_key(body);
      (void)json_nesting_depth(body);
      break;
    }
  }
  return 0;
}
