// The HTTP server as a client on the network meets it: the input is sent as it is on one connection to a live
// colibri-server (a tiny generated model on the cpu backend, the chatml template, CORS for one origin), then the
// connection is half-closed once each complete request in it has its answer. What must hold: the server closes
// within 10 s, everything it sends parses as HTTP responses, a complete request gets at least one answer, and
// afterwards GET /health still answers 200 (no request leaves it stuck or crashed).

// As in the server's own translation unit: Beast's templates must have one meaning across the program.
#define BOOST_BEAST_USE_STD_STRING_VIEW 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 with -fsanitize=address reports the boost::optional that Beast's basic_parser::put returns as
// maybe-uninitialized where it inlines it here; it is not.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "colibri/chat/template.hpp"
#include "colibri/server/server.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "fuzz_common.hpp"
#include "fuzz_model.hpp"

namespace fs = std::filesystem;
using namespace colibri;

namespace {

std::string read_source_file(const std::string& relative) {
  const auto path = fs::path(COLIBRI_TEST_SOURCE_DIR) / relative;
  FUZZ_CHECK(fs::is_regular_file(path), relative + " is missing");
  return fuzz::read_file(path);
}

struct Live {
  std::unique_ptr<server::Server> server;
  std::thread thread;
  std::uint16_t port = 0;
};

Live* live = nullptr;

void stop_live() {
  live->server->stop();
  live->thread.join();
  live->server.reset();
}

// The server, started once: the tiny Mixtral of the model_dir seeds with small weights, the byte-level BPE of the
// tokenizer_json seeds (262 ids, inside the model's 384).
Live& server_up() {
  if (live != nullptr) return *live;
  const std::string manifest = read_source_file("tests/fuzz/corpus/model_dir/mixtral_from_st.json").substr(3);
  const std::string tokenizer_json = read_source_file("tests/fuzz/corpus/tokenizer_json/byte_level_bpe.json");
  const fs::path root = fuzz::write_scratch("http-marker", "").parent_path() / "http-model";
  std::mt19937_64 rng(7);
  model::Manifest m;
  FUZZ_CHECK(fuzz::write_model_dir(root, nlohmann::json::parse(manifest), fuzz::Fill::small, rng, false, m,
                                   {{"tokenizer.json", tokenizer_json}}),
             "the mixtral seed no longer makes a model");
  auto engine = fuzz::open_model(root, m, false, 96);
  FUZZ_CHECK(engine, engine ? "" : engine.error().message());
  auto tok = tokenizer::Tokenizer::from_json(tokenizer_json, "byte_level_bpe.json");
  FUZZ_CHECK(tok, tok ? "" : tok.error().message());
  const auto source = chat::builtin_template("chatml");
  FUZZ_CHECK(source.has_value(), "no built-in chatml template");
  auto tmpl = chat::Template::parse(*source, "chatml");
  FUZZ_CHECK(tmpl, tmpl ? "" : tmpl.error().message());
  chat::ChatConfig cc;
  cc.template_source = std::string(*source);
  cc.template_origin = "built-in chatml";
  cc.eos_token = tok->eos_token();
  server::ServerOptions so;
  so.port = 0;
  so.model_name = "tiny";
  so.io_threads = 2;  // as served: a connection's handlers may run on either thread
  so.handle_signals = false;
  so.allowed_origins = {"http://app.example"};
  // Small limits, so that inputs of a few KiB reach the 413 and 431 paths too.
  so.max_body_bytes = 8u << 10;
  so.max_header_bytes = 2u << 10;
  so.request_timeout = std::chrono::milliseconds(2000);
  so.idle_timeout = std::chrono::milliseconds(2000);
  so.write_timeout = std::chrono::milliseconds(5000);
  so.scheduler.usage_history = root / "usage.json";
  auto srv = server::Server::create(std::move(*engine), std::move(*tok), std::move(*tmpl), cc, so);
  FUZZ_CHECK(srv, srv ? "" : srv.error().message());
  live = new Live;  // stopped at exit, before the statics it uses are destroyed
  live->port = (*srv)->port();
  live->server = std::move(*srv);
  live->thread = std::thread([] { live->server->run(); });
  std::atexit(stop_live);
  return *live;
}

namespace http = boost::beast::http;

// The methods of the complete requests at the start of `input`, as Beast (the server's parser too) reads them.
std::vector<http::verb> complete_requests(std::string_view input) {
  std::vector<http::verb> methods;
  while (!input.empty() && methods.size() < 64) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(1u << 20);
    parser.body_limit(1u << 24);
    boost::beast::error_code ec;
    std::size_t used = 0;
    while (!parser.is_done() && used < input.size()) {
      const std::size_t n = parser.put(boost::asio::buffer(input.data() + used, input.size() - used), ec);
      if (ec || n == 0) break;
      used += n;
    }
    if (!parser.is_done()) break;
    methods.push_back(parser.get().method());
    input.remove_prefix(used);
  }
  return methods;
}

struct Exchange {
  bool ended = true;         // the server closed within the timeout
  bool readable = true;      // every answer parsed as an HTTP response
  std::size_t requests = 0;  // complete requests in what was sent
  std::size_t answered = 0;  // final (not 1xx) answers before the half-close
  std::string response;
};

// Sends `request` on a new connection, reads an answer to each complete request in it (or until the server closes),
// then half-closes and reads until the server closes: a client that stops sending is gone, so the half-close comes
// only after the answers.
Exchange exchange(std::uint16_t port, std::string_view request) {
  Exchange x;
  std::string& response = x.response;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  FUZZ_CHECK(fd >= 0, "socket");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  timeval tv{10, 0};  // under scripts/fuzz's -timeout=20, so a stuck server is reported as such
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  FUZZ_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect to the server");
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;  // libFuzzer's timeout alarm
    if (n <= 0) break;  // the server closed early (a refused header): what it said is still read below
    sent += static_cast<std::size_t>(n);
  }
  const auto methods = complete_requests(request);
  std::size_t& answered = x.answered;
  std::size_t parsed_up_to = 0;
  x.requests = methods.size();
  std::optional<http::response_parser<http::string_body>> parser;
  bool half_closed = false;
  auto half_close = [&] {
    if (!half_closed) ::shutdown(fd, SHUT_WR);
    half_closed = true;
  };
  if (methods.empty()) half_close();
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR && std::chrono::steady_clock::now() < deadline) continue;  // libFuzzer's alarm
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) x.ended = false;
      break;
    }
    response.append(buf, static_cast<std::size_t>(n));
    // Count final answers (1xx are interim); a HEAD's answer has no body whatever its Content-Length says.
    while (!half_closed && parsed_up_to < response.size()) {
      if (!parser) {
        parser.emplace();
        parser->body_limit(1u << 30);
        if (answered < methods.size() && methods[answered] == http::verb::head) parser->skip(true);
      }
      boost::beast::error_code ec;
      const std::size_t used =
          parser->put(boost::asio::buffer(response.data() + parsed_up_to, response.size() - parsed_up_to), ec);
      parsed_up_to += used;
      if (ec == http::error::need_more || (!ec && used == 0)) break;
      if (ec) {
        x.readable = false;
        half_close();
        break;
      }
      if (parser->is_done()) {
        if (parser->get().result_int() >= 200) ++answered;
        parser.reset();
        if (answered >= methods.size()) half_close();
      }
    }
  }
  ::close(fd);
  return x;
}

bool status_line(std::string_view response) {
  // HTTP/1.0 requests are answered in 1.0.
  if (response.size() < 12 || (response.substr(0, 9) != "HTTP/1.1 " && response.substr(0, 9) != "HTTP/1.0 ")) {
    return false;
  }
  const int status = std::atoi(std::string(response.substr(9, 3)).c_str());
  return status >= 100 && status <= 599;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Live& s = server_up();
  const std::string_view request(reinterpret_cast<const char*>(data), size);
  const auto shown = fuzz::quote(request.substr(0, 300));
  const auto x = exchange(s.port, request);
  FUZZ_CHECK(x.ended, "no end to the answer to " + shown);
  FUZZ_CHECK(x.readable, "an answer that is not HTTP: " + fuzz::quote(x.response.substr(0, 300)) + " to " + shown);
  if (!x.response.empty()) {
    FUZZ_CHECK(status_line(x.response), "not an HTTP response: " + fuzz::quote(x.response.substr(0, 300)));
  }
  FUZZ_CHECK(x.requests == 0 || x.answered > 0,
             "a complete request without an answer: " + shown + "\n  got " + fuzz::quote(x.response.substr(0, 600)));
  const auto health = exchange(s.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  FUZZ_CHECK(health.ended && health.response.substr(0, 12) == "HTTP/1.1 200",
             "GET /health after " + shown + ": " + fuzz::quote(health.response.substr(0, 300)));
  return 0;
}
