// Cache admin bodies, the context check and the CLI's HTTP client (URL parsing, a refused connection).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "colibri/server/api.hpp"
#include "colibri/server/http_client.hpp"

namespace colibri::server {
namespace {

using nlohmann::json;

ApiError warm_error(const std::string& body) {
  CacheWarmRequest r;
  auto e = parse_cache_warm_request(body, r);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

TEST(ServerAdminApi, WarmBodies) {
  CacheWarmRequest r;
  EXPECT_FALSE(parse_cache_warm_request("", r));
  EXPECT_TRUE(r.experts.empty());
  EXPECT_FALSE(r.top);
  EXPECT_FALSE(parse_cache_warm_request(" {} ", r));
  EXPECT_FALSE(parse_cache_warm_request(R"({"experts": ["3:1", "0:12"]})", r));
  ASSERT_EQ(r.experts.size(), 2u);
  EXPECT_EQ(r.experts[0], (sdk::ExpertKey{3, 1}));
  EXPECT_EQ(r.experts[1], (sdk::ExpertKey{0, 12}));
  EXPECT_FALSE(parse_cache_warm_request(R"({"top": 5})", r));
  EXPECT_EQ(r.top, 5);
  EXPECT_TRUE(r.experts.empty());  // a fresh request each time

  struct Case {
    const char* body;
    const char* param;
    const char* code;
  };
  for (const auto& c : std::initializer_list<Case>{
           {R"({"experts": ["3:1", "x"]})", "experts[1]", "invalid_value"},
           {R"({"experts": ["3:"]})", "experts[0]", "invalid_value"},
           {R"({"experts": [3]})", "experts[0]", "invalid_type"},
           {R"({"experts": "3:1"})", "experts", "invalid_type"},
           {R"({"experts": []})", "experts", "invalid_value"},
           {R"({"top": 0})", "top", "invalid_value"},
           {R"({"top": "5"})", "top", "invalid_type"},
           {R"({"top": 2, "experts": ["0:0"]})", "top", "invalid_value"},
           {R"({"tpo": 2})", "tpo", "unknown_parameter"},
       }) {
    const auto e = warm_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body;
  }
  EXPECT_EQ(warm_error("[1]").status, 400);
  EXPECT_EQ(warm_error("{").status, 400);
}

TEST(ServerAdminApi, ClearTakesNoArguments) {
  EXPECT_FALSE(parse_cache_clear_request(""));
  EXPECT_FALSE(parse_cache_clear_request("{}"));
  auto e = parse_cache_clear_request(R"({"all": true})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "all");
  EXPECT_EQ(e->code, "unknown_parameter");
  EXPECT_TRUE(parse_cache_clear_request("nope"));
}

TEST(ServerAdminApi, ExpertKeys) {
  EXPECT_EQ(parse_expert_key("3:1"), (sdk::ExpertKey{3, 1}));
  for (const char* bad : {"", ":", "3", "3:", ":1", "-1:2", "3:1:2", "a:b", "1234567890:1", " 3:1"}) {
    EXPECT_FALSE(parse_expert_key(bad)) << bad;
  }
}

TEST(ServerAdminApi, ContextCheckNamesBothNumbers) {
  EXPECT_FALSE(check_context(Endpoint::completions, 10, std::nullopt, 512));
  EXPECT_FALSE(check_context(Endpoint::completions, 10, 502, 512));
  auto e = check_context(Endpoint::completions, 10, 503, 512);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "context_length_exceeded");
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("maximum context length is 512 tokens"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("you requested 513 tokens (10 in the prompt, 503 in the completion)"), std::string::npos)
      << e->message;
  e = check_context(Endpoint::chat, 600, std::nullopt, 512);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages");
  EXPECT_NE(e->message.find("resulted in 600 tokens"), std::string::npos) << e->message;
  EXPECT_TRUE(check_context(Endpoint::chat, 512, std::nullopt, 512));  // no room left to generate
  // No overflow with the largest max_tokens.
  e = check_context(Endpoint::completions, 10, std::numeric_limits<std::int64_t>::max(), 512);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("you requested 9223372036854775817 tokens"), std::string::npos) << e->message;
}

TEST(HttpClient, ParsesUrls) {
  auto u = parse_http_url("http://127.0.0.1:8080");
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->base_path, "");
  u = parse_http_url("localhost:9000/proxy/");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, 9000);
  EXPECT_EQ(u->base_path, "/proxy");
  u = parse_http_url("http://[::1]:81");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 81);
  u = parse_http_url("http://example.org");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->port, 80);
  for (const char* bad : {"https://h:1", "ftp://h", "http://", "http://h:", "http://h:0", "http://h:70000",
                          "http://h:8x", "http://u@h:1", "http://h/x?y=1", "http://[::1", "http://h st:1"}) {
    auto r = parse_http_url(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message().find(bad), std::string::npos) << r.error().message();
  }
}

TEST(HttpClient, ARefusedConnectionNamesTheUrlAndTheServer) {
  // A port nothing listens on: bind one, then close it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto u = parse_http_url(url);
  ASSERT_TRUE(u);
  auto r = http_request(*u, "GET", "/admin/cache/stats", "");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find(url), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("colibri-server"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace colibri::server
