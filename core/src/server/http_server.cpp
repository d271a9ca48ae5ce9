// The HTTP side of colibri-server. Boost.Beast (slow to compile) stays in this TU and http_client.cpp.
//
// Each connection is a Session on its own strand: read header (bounded size, deadline), answer 100-continue, read
// body (bounded size, deadline), route, answer. Generation requests become scheduler Jobs whose events are posted
// back to the session's strand; while a job runs the socket is watched for EOF so a client that goes away has its
// sequence cancelled at the next token boundary.
// beast::string_view is std::string_view; every TU that includes Beast defines this alike (ODR).
#define BOOST_BEAST_USE_STD_STRING_VIEW 1

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>
// clang-format on

#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <ctime>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <variant>

#include "colibri/engine/usage_history.hpp"
#include "colibri/server/fim.hpp"
#include "colibri/server/server.hpp"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"
#include "tokenizer/utf8.hpp"

namespace colibri::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

class Session;

struct Server::Impl {
  // Declared first so they outlive the io_context, whose destruction may destroy sessions.
  std::mutex mu;
  std::map<std::pair<std::string, int>, std::uint64_t> http_requests;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;

  std::unique_ptr<engine::Engine> engine;
  tokenizer::Tokenizer tokenizer;
  std::optional<chat::Template> chat_template;
  std::optional<chat::Template> tool_use_template;  // the model's "tool_use" template, for requests with tools
  chat::ChatConfig chat_config;
  ToolFormat tool_format = ToolFormat::none;  // how the template's model writes tool calls
  bool template_reads_tools = false;          // whether the template shows `tools` to the model
  bool tool_markers_special = false;          // the decoder must keep special tokens for the call markers
  bool split_reasoning = false;               // the template's model thinks in <think> blocks, returned apart
  bool answer_tags = false;                   // and writes its answer in <answer> tags (Hunyuan-A13B), unwrapped
  bool harmony = false;                       // the template speaks harmony (gpt-oss): channels split the answer
  ServerOptions opt;
  std::unique_ptr<Scheduler> scheduler;

  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::atomic<bool> out_of_descriptors{false};  // accept() is waiting for descriptors (warned once)
  net::signal_set signals{ioc};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::thread drainer;  // under mu: stop() may run on another thread than run() and ~Server, which join it
  std::atomic<bool> stopping{false};
  std::atomic<bool> hurry{false};  // a second signal: no more grace for streams or responses
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::int64_t created_unix = static_cast<std::int64_t>(std::time(nullptr));
  std::atomic<std::uint64_t> next_id{0};
  std::atomic<std::uint64_t> next_prompt_group{0};  // the n choices of one request share one (never 0)
  std::uint64_t id_salt = std::random_device{}();

  explicit Impl(tokenizer::Tokenizer tok) : tokenizer(std::move(tok)) {}

  void count(const std::string& route, int status) {
    std::lock_guard lock(mu);
    ++http_requests[{route, status}];
  }
  void accept();
  void stop();
  // Joins the drainer once, whichever of run() and ~Server gets it.
  void join_drainer() {
    std::thread t;
    {
      std::lock_guard lock(mu);
      t = std::move(drainer);
    }
    if (t.joinable()) t.join();
  }
  // Stops the io_context once no session is left, or at the deadline.
  void stop_when_sessions_end(std::chrono::steady_clock::time_point deadline);
  void wait_for_signal();
  std::string new_id(const char* prefix) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, static_cast<unsigned long long>(id_salt),
                  static_cast<unsigned long long>(next_id.fetch_add(1)));
    return buf;
  }
};

namespace {

bool same_key(std::string_view a, std::string_view b) {
  // Constant time in the key's content.
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

bool is_quiet_close(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
         ec == net::error::operation_aborted || ec == net::error::connection_reset ||
         ec == net::error::bad_descriptor || ec == net::error::not_connected;
}

std::string chunk(std::string_view data) {
  char head[24];
  std::snprintf(head, sizeof head, "%zx\r\n", data.size());
  std::string out(head);
  out.append(data);
  out += "\r\n";
  return out;
}

}  // namespace

class Session : public std::enable_shared_from_this<Session> {
  struct ChoiceState;

 public:
  Session(tcp::socket&& socket, Server::Impl& srv)
      : stream_(std::move(socket)),
        srv_(srv),
        read_deadline_(stream_.get_executor()),
        keepalive_timer_(stream_.get_executor()) {}

  void start(bool over_limit) {
    {
      std::lock_guard lock(srv_.mu);
      srv_.sessions[this] = weak_from_this();
    }
    if (over_limit) {
      route_ = "other";
      respond_error(ApiError{503,
                             "Too many open connections (colibri-server --max-connections " +
                                 std::to_string(srv_.opt.max_connections) + "). Retry later.",
                             "server_error", "", "too_many_connections"},
                    /*close=*/true);
      return;
    }
    read_request();
  }

  ~Session() {
    std::lock_guard lock(srv_.mu);
    srv_.sessions.erase(this);
  }

  // Shutdown: a connection waiting for its next request is closed now; one with a response in flight closes after
  // it (keep-alive is off once stopping).
  void close_if_idle() {
    if (idle_) close_now();
  }
  // At --max-connections: a connection kept alive after its answer, waiting for another, gives its place up (as
  // nginx reuses idle keep-alive connections); one whose first request is arriving does not.
  void close_if_idle_keep_alive() {
    if (idle_ && between_requests_) close_now();
  }
  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  void read_request() {
    idle_ = true;
    if (srv_.stopping) return close_now();
    request_id_.clear();  // an answer before the next request parses (400, 408) is not the last one's
    parser_.emplace();
    parser_->header_limit(srv_.opt.max_header_bytes);
    parser_->body_limit(srv_.opt.max_body_bytes);
    arm_read_deadline(first_ ? srv_.opt.request_timeout : srv_.opt.idle_timeout);
    between_requests_ = !first_;
    first_ = false;
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  // Reads run under a timer of their own rather than the stream's expiry (which closes the socket): a request that
  // stops arriving can then still be told so with a 408, as nginx and Apache do.
  void arm_read_deadline(std::chrono::milliseconds timeout) {
    stream_.expires_never();
    read_timed_out_ = false;
    read_done_ = false;
    const std::uint64_t read = ++reads_;
    read_deadline_.expires_after(timeout);
    read_deadline_.async_wait([weak = weak_from_this(), read](beast::error_code ec) {
      if (ec) return;  // cancelled: the read finished first
      // A read that finished as the timer fired (its handler already queued) is no longer the one to cut short.
      if (auto self = weak.lock(); self && self->reads_ == read && !self->read_done_) {
        self->read_timed_out_ = true;
        self->stream_.cancel();
      }
    });
  }

  // A request begun and not finished within --request-timeout.
  void respond_request_timeout() {
    const auto seconds = std::chrono::duration<double>(srv_.opt.request_timeout).count();
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", seconds);
    respond_error(ApiError{408,
                           "The request did not arrive whole within " + std::string(limit) +
                               " s (colibri-server --request-timeout); send it again.",
                           "invalid_request_error", "", "request_timeout"},
                  /*close=*/true);
  }

  void on_header(beast::error_code ec) {
    idle_ = false;
    route_ = "other";
    read_done_ = true;
    read_deadline_.cancel();
    if (ec) {
      // Timed out: a request that had begun is answered; an idle keep-alive connection just closes.
      if (read_timed_out_) return parser_->got_some() ? respond_request_timeout() : close_now();
      if (ec == http::error::header_limit) {
        return respond_error(ApiError{431,
                                      "The request headers are larger than the server's limit of " +
                                          std::to_string(srv_.opt.max_header_bytes) + " bytes.",
                                      "invalid_request_error", "", "headers_too_large"},
                             true);
      }
      // Beast checks a declared Content-Length against the body limit while parsing the header.
      if (ec == http::error::body_limit) return respond_error(too_large(srv_.opt.max_body_bytes), true);
      if (is_quiet_close(ec) || ec == http::error::partial_message) return close_now();
      return respond_error(bad_request("Malformed HTTP request: " + ec.message() + "."), true);
    }
    auto& req = parser_->get();
    // RFC 9112 6.1, 6.3: a request body is framed by chunked as the last transfer coding or by Content-Length. Any
    // other coding would leave the body's end unknown (Beast then reads none, and the body's bytes would be taken for
    // the next request): refused, and the connection closed.
    const auto codings = req.equal_range(http::field::transfer_encoding);
    int chunked = 0;
    for (auto field = codings.first; field != codings.second; ++field) {
      for (const auto& coding : http::token_list(field->value())) {
        if (beast::iequals(coding, "chunked")) {
          ++chunked;
          continue;
        }
        return respond_error(ApiError{501,
                                      "Transfer-Encoding '" + std::string(coding) +
                                          "' is not supported; send the body uncoded (no Transfer-Encoding), or "
                                          "with 'chunked' alone.",
                                      "invalid_request_error", "", "unsupported_transfer_encoding"},
                             true);
      }
    }
    if (chunked > 1) {
      return respond_error(bad_request("Malformed HTTP request: Transfer-Encoding names 'chunked' more than once."),
                           true);
    }
    if (req.find(http::field::transfer_encoding) != req.end() && !parser_->chunked()) {
      return respond_error(bad_request("Malformed HTTP request: Transfer-Encoding must end in 'chunked'."), true);
    }
    const auto length = parser_->content_length();
    if (length && *length > srv_.opt.max_body_bytes) return respond_error(too_large(srv_.opt.max_body_bytes), true);
    arm_read_deadline(srv_.opt.request_timeout);
    auto expect = req[http::field::expect];
    if (!expect.empty() && beast::iequals(expect, "100-continue")) {
      auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*msg), [self = shared_from_this(), msg](beast::error_code e, std::size_t) {
        if (e) return self->close_now();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    read_done_ = true;
    read_deadline_.cancel();
    if (ec) {
      if (read_timed_out_) return respond_request_timeout();
      if (ec == http::error::body_limit) return respond_error(too_large(srv_.opt.max_body_bytes), true);
      if (is_quiet_close(ec) || ec == http::error::partial_message) return close_now();
      return respond_error(bad_request("Malformed HTTP request: " + ec.message() + "."), true);
    }
    stream_.expires_never();
    request_ = parser_->release();
    request_id_ = request_id();
    keep_alive_ = request_.keep_alive();
    try {
      handle();
    } catch (const std::exception& e) {
      spdlog::error("request {} {} failed: {}", std::string(request_.method_string()), std::string(request_.target()),
                    e.what());
      if (jobs_.empty() && !responding_)
        respond_error(internal_error(std::string("Internal error: ") + e.what()), true);
    }
  }

  // The request's Origin when --allow-origin admits it ("" otherwise): answers carry it back as
  // Access-Control-Allow-Origin so that the browser lets the page read them.
  [[nodiscard]] std::string allowed_origin() const {
    const auto origin = request_[http::field::origin];
    if (origin.empty()) return {};
    for (const auto& o : srv_.opt.allowed_origins) {
      if (o == "*" || beast::iequals(o, origin)) return std::string(origin);
    }
    return {};
  }

  // The request's X-Request-Id when it is a plain token (as vLLM and proxies pass one through), else one made here:
  // every answer carries it, so a client's log line and the server's name the same request.
  [[nodiscard]] std::string request_id() const {
    const auto given = request_["X-Request-Id"];
    const bool plain = !given.empty() && given.size() <= 128 && std::all_of(given.begin(), given.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ':';
    });
    return plain ? std::string(given) : srv_.new_id("req-");
  }

  template <class Response>
  void add_answer_headers(Response& res) const {  // x-request-id, and CORS
    if (!request_id_.empty()) res.set("x-request-id", request_id_);
    if (srv_.opt.allowed_origins.empty()) return;
    res.set(http::field::vary, "Origin");
    if (const auto origin = allowed_origin(); !origin.empty())
      res.set(http::field::access_control_allow_origin, origin);
  }

  void handle() {
    std::string_view target = request_.target();
    // The absolute form a proxy may send (RFC 9112 3.2.2: a server must accept it): http://host:port/path.
    for (std::string_view scheme : {"http://", "https://"}) {
      if (target.size() > scheme.size() && beast::iequals(target.substr(0, scheme.size()), scheme)) {
        const auto slash = target.find('/', scheme.size());
        target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
      }
    }
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    // A trailing slash names the same route (/v1/chat/completions/), as FastAPI-based servers redirect it.
    if (target.size() > 1 && target.back() == '/') target.remove_suffix(1);
    const auto method = request_.method();
    if (method == http::verb::options && !allowed_origin().empty() &&
        !request_[http::field::access_control_request_method].empty()) {
      // A CORS preflight: browsers send it without credentials, so it is answered before the key check.
      route_ = "preflight";
      auto res = std::make_shared<http::response<http::string_body>>(http::status::no_content, 11);
      res->set(http::field::access_control_allow_methods, "GET, POST, OPTIONS");
      const auto asked = request_[http::field::access_control_request_headers];
      res->set(http::field::access_control_allow_headers,
               asked.empty() ? std::string("Authorization, Content-Type") : std::string(asked));
      res->set(http::field::access_control_max_age, "600");
      return send(res, 204, "", "text/plain", false);
    }
    auto only = [&](http::verb allowed, const char* route) {
      route_ = route;
      // HEAD where GET works (RFC 9110): the same answer without its body.
      if (method == allowed || (method == http::verb::head && allowed == http::verb::get)) return true;
      allow_ = allowed == http::verb::get ? "GET, HEAD" : std::string(http::to_string(allowed));  // RFC 9110 15.5.6
      respond_error(ApiError{405,
                             "Method " + std::string(request_.method_string()) + " is not allowed on " +
                                 std::string(target) + "; use " + std::string(http::to_string(allowed)) + ".",
                             "invalid_request_error", "", "method_not_allowed"},
                    false);
      return false;
    };
    if (target == "/health") {
      if (!only(http::verb::get, "/health")) return;
      const auto st = srv_.scheduler->stats();
      json body{{"status", srv_.stopping ? "shutting_down" : "ok"},
                {"model", srv_.opt.model_name},
                {"queue_depth", st.queue_depth},
                {"active_sequences", st.active}};
      return respond(srv_.stopping ? 503 : 200, body.dump(), "application/json");
    }
    if (target == "/metrics") {
      if (!only(http::verb::get, "/metrics")) return;
      std::map<std::pair<std::string, int>, std::uint64_t> counts;
      {
        std::lock_guard lock(srv_.mu);
        counts = srv_.http_requests;
      }
      const double up = std::chrono::duration<double>(std::chrono::steady_clock::now() - srv_.started).count();
      return respond(200, render_metrics(srv_.scheduler->stats(), counts, srv_.opt.model_name, up),
                     "text/plain; version=0.0.4; charset=utf-8");
    }
    const bool api = target.starts_with("/v1/") || target == "/v1" || target.starts_with("/admin/") ||
                     target == "/tokenize" || target == "/detokenize";
    if (api && !srv_.opt.api_key.empty()) {
      const auto auth = request_[http::field::authorization];
      constexpr std::string_view kBearer = "Bearer ";
      if (auth.size() < kBearer.size() || !beast::iequals(auth.substr(0, kBearer.size()), kBearer) ||
          !same_key(auth.substr(kBearer.size()), srv_.opt.api_key)) {
        route_ = target.starts_with("/admin/") ? "/admin" : "/v1";
        return respond_error(unauthorized(), false);
      }
    }
    if (api && method == http::verb::post) {
      auto e = check_post_media_type(request_[http::field::content_type]);
      if (!e) e = check_post_encoding(request_[http::field::content_encoding]);
      if (e) {
        route_ = target.starts_with("/admin/") ? "/admin" : "/v1";
        return respond_error(*e, false);
      }
    }
    if (target == "/v1/models") {
      if (!only(http::verb::get, "/v1/models")) return;
      json list{{"object", "list"}, {"data", json::array({model_object()})}};
      return respond(200, list.dump(), "application/json");
    }
    if (target.starts_with("/v1/models/")) {
      if (!only(http::verb::get, "/v1/models/{model}")) return;
      const auto raw = target.substr(std::string_view("/v1/models/").size());
      const auto name = percent_decoded(raw);  // org%2Fname, as openai-node sends a name with a slash
      if (!name)
        return respond_error(bad_request("Malformed %-escape in the model name '" + std::string(raw) + "'."), false);
      if (auto e = check_model(*name, srv_.opt.model_name)) return respond_error(*e, false);
      return respond(200, model_object().dump(), "application/json");
    }
    if (target == "/v1/chat/completions") {
      if (!only(http::verb::post, "/v1/chat/completions")) return;
      return start_generation(Endpoint::chat);
    }
    if (target == "/v1/completions") {
      if (!only(http::verb::post, "/v1/completions")) return;
      return start_generation(Endpoint::completions);
    }
    if (target == "/tokenize") {
      if (!only(http::verb::post, "/tokenize")) return;
      return tokenize();
    }
    if (target == "/detokenize") {
      if (!only(http::verb::post, "/detokenize")) return;
      std::string model;
      std::vector<std::int32_t> tokens;
      if (auto e = parse_detokenize_request(request_.body(), model, tokens)) return respond_error(*e, false);
      if (!model.empty()) {
        if (auto e = check_model(model, srv_.opt.model_name)) return respond_error(*e, false);
      }
      if (auto e = check_token_ids(tokens, "tokens")) return respond_error(*e, false);
      const std::string text = srv_.tokenizer.decode(tokens);
      // vLLM answers "prompt", llama.cpp "content".
      return respond(200,
                     json{{"prompt", text}, {"content", text}}.dump(-1, ' ', false, json::error_handler_t::replace),
                     "application/json");
    }
    if (target == "/admin/cache/stats") {
      if (!only(http::verb::get, "/admin/cache/stats")) return;
      return respond(200, cache_stats().dump(), "application/json");
    }
    if (target == "/admin/cache/clear") {
      if (!only(http::verb::post, "/admin/cache/clear")) return;
      if (auto e = parse_cache_clear_request(request_.body())) return respond_error(*e, false);
      return run_admin([](engine::Engine& eng) -> AdminResult {
        const auto r = eng.experts().clear();
        ojson out{{"object", "cache.clear"},          {"dropped_experts", r.dropped},
                  {"dropped_bytes", r.dropped_bytes}, {"kept_in_use", r.kept_in_use},
                  {"kept_pinned", r.kept_pinned},     {"vram_dropped_experts", r.vram_dropped}};
        return with_residency(std::move(out), eng.experts());
      });
    }
    if (target == "/admin/cache/warm") {
      if (!only(http::verb::post, "/admin/cache/warm")) return;
      CacheWarmRequest req;
      if (auto e = parse_cache_warm_request(request_.body(), req)) return respond_error(*e, false);
      const auto& manifest = srv_.engine->manifest();  // immutable: safe to read here
      for (std::size_t i = 0; i < req.experts.size(); ++i) {
        const auto k = req.experts[i];
        if (manifest.expert(k.layer, k.expert) == nullptr) {
          return respond_error(
              bad_request("Invalid value for 'experts[" + std::to_string(i) + "]': the model has no expert " +
                              std::to_string(k.layer) + ":" + std::to_string(k.expert) + ".",
                          "experts[" + std::to_string(i) + "]", "invalid_value"),
              false);
        }
      }
      auto history = srv_.opt.scheduler.usage_history;
      return run_admin([req = std::move(req), history = std::move(history)](engine::Engine& eng) -> AdminResult {
        return warm_cache(eng, req, history);
      });
    }
    route_ = "other";
    respond_error(not_found_route(request_.method_string(), target), false);
  }

  // Ids beyond the model's vocabulary in `field` (prompt, tokens): a 400 naming the first one and where it is.
  std::optional<ApiError> check_token_ids(const std::vector<std::int32_t>& ids, const std::string& field) const {
    const auto vocab = srv_.scheduler->vocab_size();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= vocab) {
        const std::string at = field + "[" + std::to_string(i) + "]";
        return bad_request("Invalid token id " + std::to_string(ids[i]) + " at " + at + ": the vocabulary has " +
                               std::to_string(vocab) + " tokens.",
                           at, "invalid_value");
      }
    }
    return std::nullopt;
  }

  // POST /tokenize: a text (with the tokenizer's special tokens unless asked not to) or a chat as the template
  // renders it. Answers vLLM's {count, max_model_len, tokens}.
  void tokenize() {
    TokenizeRequest req;
    if (auto e = parse_tokenize_request(request_.body(), req)) return respond_error(*e, false);
    if (!req.model.empty()) {
      if (auto e = check_model(req.model, srv_.opt.model_name)) return respond_error(*e, false);
    }
    std::vector<std::int32_t> tokens;
    if (req.chat) {
      std::string text;
      if (auto e = chat_prompt(req.chat_request, req.add_generation_prompt, text)) return respond_error(*e, false);
      tokens = srv_.tokenizer.encode(text, /*add_special=*/false);
    } else {
      tokens = srv_.tokenizer.encode(req.text, req.add_special);
    }
    json body{{"count", tokens.size()}, {"max_model_len", srv_.scheduler->context()}, {"tokens", tokens}};
    return respond(200, body.dump(), "application/json");
  }

  // --- cache admin: runs on the scheduler thread between steps; the answer comes back to this strand ---

  // Admin answers keep their keys in the order written (readable as `colibri-cli cache` prints them).
  using ojson = nlohmann::ordered_json;
  using AdminResult = std::variant<ojson, ApiError>;

  void run_admin(std::function<AdminResult(engine::Engine&)> op) {
    auto self = shared_from_this();
    const bool posted = srv_.scheduler->post([self, op = std::move(op)](engine::Engine& eng) {
      AdminResult result;
      try {
        result = op(eng);
      } catch (const std::exception& e) {
        result = internal_error(std::string("Internal error: ") + e.what());
      }
      self->srv_.scheduler->publish_expert_stats();  // a stats request after this answer sees the change
      net::post(self->stream_.get_executor(), [self, result = std::move(result)] {
        if (const auto* body = std::get_if<ojson>(&result)) return self->respond(200, body->dump(), "application/json");
        self->respond_error(std::get<ApiError>(result), false);
      });
    });
    if (!posted) respond_error(unavailable("The server is shutting down."), true);
  }

  static ojson with_residency(ojson out, const engine::ExpertManager& experts) {
    out["resident_experts"] = experts.resident_count();
    out["resident_bytes"] = experts.resident_bytes();
    out["budget_bytes"] = experts.budget_bytes();
    return out;
  }

  // The named experts, or the most used ones (the usage history file plus this process's counts).
  static AdminResult warm_cache(engine::Engine& eng, const CacheWarmRequest& req,
                                const std::filesystem::path& history_path) {
    std::vector<sdk::ExpertKey> keys = req.experts;
    ojson out{{"object", "cache.warm"}};
    if (keys.empty()) {
      auto history = engine::load_usage_history(history_path);
      if (!history) return internal_error("Cannot read the usage history: " + history.error().message());
      if (auto why = engine::history_mismatch(*history, history_path, eng.model_dir()); !why.empty()) {
        history->counts.clear();  // another model's counts; this process's own still count
        spdlog::warn("{}; warming from this server's own counts", why);
      }
      history->add_packed(eng.experts().usage());
      const auto& manifest = eng.manifest();
      const std::size_t n = req.top ? static_cast<std::size_t>(*req.top) : history->counts.size();
      for (const auto& [layer, expert] : history->most_used(n)) {
        if (manifest.expert(layer, expert) == nullptr) {
          return bad_request("The usage history " + history_path.string() + " names expert " + std::to_string(layer) +
                                 ":" + std::to_string(expert) +
                                 ", which this model does not have; remove the file or name the experts to warm.",
                             req.top ? "top" : "", "invalid_usage_history");
        }
        keys.push_back({layer, expert});
      }
      if (keys.empty()) {
        return bad_request("No expert usage is known yet (" + history_path.string() +
                               " is empty or missing and this server has run no request); send requests first or "
                               "name the experts: {\"experts\": [\"0:1\", ...]}.",
                           req.top ? "top" : "", "no_usage_history");
      }
      out["source"] = "usage_history";
      out["usage_history"] = history_path.string();
    } else {
      out["source"] = "experts";
    }
    auto r = eng.experts().warm(keys);
    if (!r) return internal_error("Warming the expert cache failed: " + r.error().message());
    out["requested"] = keys.size();
    out["loaded"] = r->loaded;
    out["already_resident"] = r->already_resident;
    out["no_room"] = r->no_room;
    out["bytes_read"] = r->bytes_read;
    return with_residency(std::move(out), eng.experts());
  }

  json model_object() const {
    return json{
        {"id", srv_.opt.model_name}, {"object", "model"}, {"created", srv_.created_unix}, {"owned_by", "colibri"}};
  }

  ojson cache_stats() const {
    const auto st = srv_.scheduler->stats();
    const auto& p = srv_.engine->plugins();
    return ojson{{"mode", srv_.engine->mode()},
                 {"policy", p.cache_name},
                 {"storage", p.storage_name},
                 {"hits", st.experts.hits},
                 {"misses", st.experts.misses},
                 // null before the first lookup: 1.0 would claim hits that never happened
                 {"hit_rate", st.experts.hits + st.experts.misses == 0 ? ojson(nullptr) : ojson(st.experts.hit_rate())},
                 // Prefetched reads evict too: evictions can exceed misses by up to the prefetches issued.
                 {"prefetch_issued", st.experts.prefetch_issued},
                 {"preloaded", st.experts.preloaded},
                 {"evictions", st.experts.evictions},
                 {"bytes_read", st.experts.bytes_read},
                 {"stall_seconds", st.experts.stall_seconds},
                 {"vram_hits", st.experts.vram_hits},
                 {"vram_misses", st.experts.vram_misses},
                 {"vram_evictions", st.experts.vram_evictions},
                 {"bytes_uploaded", st.experts.bytes_uploaded},
                 {"cpu_fallback_runs", st.experts.cpu_runs},
                 {"resident_experts", st.expert_resident_count},
                 {"resident_bytes", st.expert_resident_bytes},
                 {"budget_bytes", st.expert_budget_bytes}};
  }

  // --- generation ---------------------------------------------------------------------------------------------

  void start_generation(Endpoint endpoint) {
    endpoint_ = endpoint;
    CompletionRequest req;
    if (auto e = parse_completion_request(request_.body(), endpoint, req, srv_.opt.sampling_defaults)) {
      return respond_error(*e, false);
    }
    if (!req.model.empty()) {
      if (auto e = check_model(req.model, srv_.opt.model_name)) return respond_error(*e, false);
    }
    // One entry per prompt: a batch of completions prompts is one choice per prompt (n each).
    struct PromptPlan {
      std::vector<std::int32_t> tokens;
      std::string echo_text;
      std::vector<std::int64_t> checkpoints;  // GenerationRequest::checkpoints
    };
    std::vector<PromptPlan> prompts(endpoint == Endpoint::chat ? 1 : req.prompt_count());
    bool opens_reasoning = false;   // the prompt ends inside a <think> block
    bool closes_reasoning = false;  // or after one: the answer does not think
    // Harmony: the answer's channels are split into reasoning, content and calls (not in JSON mode or a forced
    // call, whose text is the JSON from the first token).
    const bool forced_call = req.tool_choice == CompletionRequest::ToolChoice::function ||
                             req.tool_choice == CompletionRequest::ToolChoice::required;
    const bool use_harmony = endpoint == Endpoint::chat && srv_.harmony && !req.json_object && !forced_call;
    std::string harmony_prompt;  // where the prompt leaves the answer: in a header or inside a message
    if (endpoint == Endpoint::chat) {
      std::string text;
      if (auto e = chat_prompt(req, req.add_generation_prompt, text)) return respond_error(*e, false);
      // A named call: the answer starts as that call, so the model writes only its arguments (in JSON mode).
      if (req.tool_choice == CompletionRequest::ToolChoice::function) {
        text += forced_call_prefix(srv_.tool_format, req.tool_choice_name);
      }
      // "required" with several: the answer starts as a call and names one of them inside its JSON; where the
      // syntax has no opener to start it with (or names the function outside JSON), the answer is the call object
      // alone, plain JSON, as vLLM forces "required" on every model.
      if (req.tool_choice == CompletionRequest::ToolChoice::required) text += required_call_prefix(srv_.tool_format);
      // Harmony in JSON mode: the JSON is the final channel's text.
      if (srv_.harmony && req.json_object && !forced_call && text.ends_with("<|start|>assistant")) {
        text += "<|channel|>final<|message|>";
      }
      opens_reasoning = prompt_opens_reasoning(text);
      closes_reasoning = prompt_closes_reasoning(text);
      if (use_harmony) harmony_prompt = text.substr(std::min(text.size(), text.rfind("<|start|>")));
      prompts[0].tokens = srv_.tokenizer.encode(text, /*add_special=*/false);
      if (srv_.scheduler->keeps_checkpoints()) {
        prompts[0].checkpoints = chat::parting_positions(req.messages, prompts[0].tokens, [&](std::size_t n) {
          std::string head;
          return chat_prompt(req, false, head, n) ? std::nullopt
                                                  : std::optional(srv_.tokenizer.encode(head, /*add_special=*/false));
        });
      }
    }
    const auto ctx = srv_.scheduler->context();
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      auto& plan = prompts[p];
      // Errors name the batch's prompt: "prompt[2]: ...".
      const bool batch = prompts.size() > 1 || req.prompt_is_list;
      const std::string where = batch ? "prompt[" + std::to_string(p) + "]" : "prompt";
      auto named = [&](ApiError e) {
        if (batch) {
          e.message = where + ": " + e.message;
          if (e.param == "prompt") e.param = where;
        }
        return e;
      };
      if (endpoint == Endpoint::completions && req.prompt_is_tokens) {
        const auto& ids = p == 0 ? req.prompt_tokens : req.more_prompt_tokens[p - 1];
        if (auto e = check_token_ids(ids, where)) return respond_error(*e, false);
        plan.tokens = ids;
        if (req.echo) plan.echo_text = srv_.tokenizer.decode(plan.tokens, true);
      } else if (endpoint == Endpoint::completions) {
        const auto& text = p == 0 ? req.prompt : req.more_prompts[p - 1];
        if (req.suffix) {
          const auto fim = find_fim_tokens(srv_.tokenizer);
          if (!fim) {
            return respond_error(bad_request("'suffix' needs a model trained to fill in the middle; this tokenizer "
                                             "has none of the token sets " +
                                                 fim_token_names() + ".",
                                             "suffix", "unsupported_value"),
                                 false);
          }
          plan.tokens = fim_prompt(srv_.tokenizer, *fim, text, *req.suffix);
        } else {
          plan.tokens = srv_.tokenizer.encode(text, /*add_special=*/true);
        }
        if (req.echo) plan.echo_text = text;
      }
      if (plan.tokens.empty()) {
        return respond_error(named(bad_request("The prompt is empty.", "prompt", "invalid_value")), false);
      }
      const auto prompt_tokens = static_cast<std::int64_t>(plan.tokens.size());
      if (auto e = check_context(endpoint, prompt_tokens, req.max_tokens, ctx)) return respond_error(named(*e), false);
    }
    // Token ids the model does not have (known only here, from the vocabulary): a 400 naming the field.
    std::optional<ApiError> outside_vocabulary;
    const auto check_id = [&](std::int32_t id, const char* field, const std::string& param) {
      if (outside_vocabulary || id < srv_.scheduler->vocab_size()) return;
      outside_vocabulary =
          bad_request("Invalid token id " + std::to_string(id) + " in '" + field + "': the vocabulary has " +
                          std::to_string(srv_.scheduler->vocab_size()) + " tokens.",
                      param, "invalid_value");
    };
    for (const auto& [id, bias] : req.sampling.logit_bias) {
      check_id(id, "logit_bias", "logit_bias." + std::to_string(id));
    }
    for (std::size_t i = 0; i < req.stop_token_ids.size(); ++i) {
      check_id(req.stop_token_ids[i], "stop_token_ids", "stop_token_ids[" + std::to_string(i) + "]");
    }
    if (outside_vocabulary) return respond_error(*outside_vocabulary, false);
    if (!req.seed_given) req.sampling.seed = std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32);
    if (auto s = req.sampling.validate(); !s) return respond_error(bad_request(s.message()), false);

    // A forced call's arguments follow the function's parameters schema: what colibri cannot enforce (a pattern,
    // a minimum) is left out and the rest (types, properties, required) holds; a schema that is wrong leaves them
    // any JSON object, as without a schema.
    std::shared_ptr<const engine::JsonSchema> forced_schema;
    // "required" with several: the call names one of them, and its arguments follow that one's parameters.
    if (req.tool_choice == CompletionRequest::ToolChoice::required) {
      std::vector<std::pair<std::string, nlohmann::ordered_json>> tools;
      for (const auto& tool : req.tools) {
        const auto& fn = tool["function"];
        tools.emplace_back(fn["name"].get<std::string>(), fn.contains("parameters") ? fn["parameters"] : nullptr);
      }
      std::vector<std::string> skipped;
      auto s = engine::JsonSchema::compile_tool_call(tools, skipped, call_arguments_key(srv_.tool_format));
      if (!s) return respond_error(bad_request("'tool_choice': 'required': " + s.error().message(), "tools"), false);
      forced_schema = *s;
      if (!skipped.empty()) spdlog::debug("required call: parameters enforced but for {}", fmt::join(skipped, ", "));
    }
    if (req.tool_choice == CompletionRequest::ToolChoice::function) {
      for (const auto& tool : req.tools) {
        const auto& fn = tool["function"];
        if (fn["name"] != req.tool_choice_name || !fn.contains("parameters")) continue;
        std::vector<std::string> skipped;
        auto s = engine::JsonSchema::compile_lenient(nlohmann::ordered_json::parse(fn["parameters"].dump()), skipped);
        if (!s) {
          spdlog::debug("tool {}: parameters not enforced: {}", req.tool_choice_name, s.error().message());
          continue;
        }
        forced_schema = *s;
        if (!skipped.empty()) {
          spdlog::debug("tool {}: parameters enforced but for {}", req.tool_choice_name, fmt::join(skipped, ", "));
        }
      }
    }
    // JSON mode on a thinking model: its <think> block comes first, free, and is returned as reasoning_content; the
    // JSON follows. A forced call's prompt already starts the call.
    const bool json_after_thinking =
        endpoint == Endpoint::chat && srv_.split_reasoning && req.json_object && !forced_call && !closes_reasoning;
    const std::size_t job_count = prompts.size() * static_cast<std::size_t>(req.n);
    if (const auto& so = srv_.scheduler->options(); job_count > static_cast<std::size_t>(so.max_batch) &&
                                                    job_count - static_cast<std::size_t>(so.max_batch) > so.max_queue) {
      const std::string asked = prompts.size() > 1
                                    ? std::to_string(prompts.size()) + " prompts times n " + std::to_string(req.n) +
                                          " is " + std::to_string(job_count) + " sequences"
                                    : "n is " + std::to_string(req.n);
      return respond_error(bad_request(asked + ", but this server runs " + std::to_string(so.max_batch) +
                                           " sequences and queues " + std::to_string(so.max_queue) +
                                           " more at most (colibri-server --max-batch, --max-queue); ask for fewer",
                                       prompts.size() > 1 ? "prompt" : "n", "invalid_value"),
                           false);
    }
    // One job per choice; events carry the request's generation so that a late event of an earlier request on
    // this connection is never taken for this one's.
    const std::uint64_t generation = ++generation_;
    std::vector<std::shared_ptr<Job>> jobs;
    std::uint64_t prompt_group = 0;
    // Choice index = prompt * n + i, as OpenAI numbers a batch's choices.
    for (std::size_t index = 0; index < job_count; ++index) {
      const std::size_t p = index / static_cast<std::size_t>(req.n);
      const int i = static_cast<int>(index % static_cast<std::size_t>(req.n));
      if (i == 0) prompt_group = req.n > 1 ? ++srv_.next_prompt_group : 0;
      auto job = std::make_shared<Job>();
      job->request.prompt = prompts[p].tokens;
      job->request.checkpoints = prompts[p].checkpoints;
      job->request.max_tokens = req.max_tokens.value_or(ctx - static_cast<std::int64_t>(prompts[p].tokens.size()));
      job->request.stop = req.stop;
      job->request.sampling = req.sampling;
      if (req.seed_given) job->request.sampling.seed = req.sampling.seed + static_cast<std::uint64_t>(i);
      if (!req.seed_given && i > 0) {
        job->request.sampling.seed = std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32);
      }
      job->request.logprobs = req.logprobs;
      job->request.prompt_logprobs = req.echo && req.logprobs >= 0;
      job->request.prompt_group = prompt_group;
      job->request.json_object = req.json_object;
      job->request.min_tokens = req.min_tokens;
      job->request.ignore_eos = req.ignore_eos;
      job->request.draft_max = req.draft_max;
      job->request.draft_min = req.draft_min;
      job->request.draft_p_min = req.draft_p_min;
      job->request.stop_token_ids = req.stop_token_ids;
      job->request.json_schema = req.json_schema;
      if (json_after_thinking) {
        job->request.json_thinking =
            opens_reasoning ? engine::JsonAnswer::Thinking::inside : engine::JsonAnswer::Thinking::may_open;
      }
      if (req.tool_choice == CompletionRequest::ToolChoice::function ||
          req.tool_choice == CompletionRequest::ToolChoice::required) {
        job->request.json_object = true;
        job->request.json_schema = forced_schema;
      }
      // A completion's text, and the rest of a continued final message, follow the prompt's text: a SentencePiece
      // token's leading space stays. A chat answer is a text of its own, as the template renders it next turn.
      job->request.continues_prompt = endpoint_ == Endpoint::completions || req.continue_final_message;
      // Harmony's markers are special tokens: they are kept for HarmonyStream to see them.
      if (use_harmony) job->request.keep_special = true;
      if (req.tool_choice == CompletionRequest::ToolChoice::automatic && srv_.tool_format != ToolFormat::harmony) {
        job->request.keep_special = srv_.tool_markers_special;
      }
      job->on_event = [self = shared_from_this(), generation, index](GenerationEvent&& ev) {
        net::post(self->stream_.get_executor(), [self, generation, index, ev = std::move(ev)]() mutable {
          if (generation == self->generation_) self->on_event(index, std::move(ev));
        });
      };
      jobs.push_back(std::move(job));
    }
    logprobs_wanted_ = req.logprobs >= 0;
    choices_.assign(jobs.size(), ChoiceState{});
    const ToolSchemas tool_schemas(req.tools);  // what each choice's calls may name, and their values' types
    parallel_tool_calls_ = req.parallel_tool_calls;
    prompt_usage_.assign(prompts.size(), PromptUsage{});
    for (std::size_t index = 0; index < choices_.size(); ++index) {
      auto& c = choices_[index];
      c.prompt_index = index / static_cast<std::size_t>(req.n);
      const auto& echo_text = prompts[c.prompt_index].echo_text;
      c.text = echo_text;
      c.echo_with_logprobs = !echo_text.empty() && req.logprobs >= 0;
      // Completions count logprob offsets in characters, echo included (the prompt's own tokens, listed with echo,
      // get theirs from the decoded prompt: see echo_text_offsets).
      c.text_offset = static_cast<std::int64_t>(tokenizer::utf8::code_point_count(echo_text));
      if (use_harmony) {
        c.harmony.emplace(harmony_prompt, req.tool_choice == CompletionRequest::ToolChoice::automatic, tool_schemas);
      } else if (req.tool_choice == CompletionRequest::ToolChoice::automatic) {
        c.tool_stream.emplace(srv_.tool_format, tool_schemas);
      } else if (req.tool_choice == CompletionRequest::ToolChoice::required) {
        c.tool_stream.emplace(ToolCallStream::required_call());
      }
      // A forced call writes JSON from the first token: there is no thinking block to split off.
      if (endpoint == Endpoint::chat && srv_.split_reasoning && !forced_call &&
          (!req.json_object || json_after_thinking)) {
        c.reasoning.emplace(opens_reasoning, srv_.answer_tags);
      }
      c.required_call = req.tool_choice == CompletionRequest::ToolChoice::required;
      if (req.tool_choice == CompletionRequest::ToolChoice::function) {
        c.forced = ToolCall{tool_call_id(srv_.tool_format, random_u64()), req.tool_choice_name, ""};
      }
    }
    open_choices_ = jobs.size();
    usage_ = Usage{};
    ids_.id = srv_.new_id(endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-");
    ids_.created = static_cast<std::int64_t>(std::time(nullptr));
    ids_.model = srv_.opt.model_name;
    streaming_ = req.stream;
    include_usage_ = req.include_usage;
    if (const auto submitted = srv_.scheduler->submit(jobs); submitted != Scheduler::Submit::accepted) {
      if (submitted == Scheduler::Submit::queue_full)
        return respond_error(busy(srv_.scheduler->options().max_queue, req.n), false);
      return respond_error(unavailable("The server is shutting down."), true);
    }
    jobs_ = std::move(jobs);
    watch_disconnect();
    if (streaming_) {
      http::response<http::empty_body> res{http::status::ok, request_.version()};
      res.set(http::field::server, "colibri");
      res.set(http::field::content_type, "text/event-stream");
      res.set(http::field::cache_control, "no-cache");
      add_answer_headers(res);
      http10_ = request_.version() < 11;
      if (http10_) keep_alive_ = false;
      res.chunked(!http10_);
      res.keep_alive(keep_alive_);
      std::ostringstream head;
      head << res.base();
      pending_ = head.str();
      for (std::size_t i = 0; i < jobs_.size(); ++i) {
        const auto& echo_text = prompts[choices_[i].prompt_index].echo_text;
        // An echo with logprobs waits for them, to go out as one chunk with its text (as vLLM sends it).
        if (endpoint == Endpoint::chat || (!echo_text.empty() && !choices_[i].echo_with_logprobs)) {
          pending_ += frame(choice_event(
              stream_chunk(endpoint_, ids_, echo_text, "", endpoint == Endpoint::chat, nullptr, static_cast<int>(i))));
        }
      }
      srv_.count(route_, 200);
      flush();
      arm_keepalive(generation_);
    }
  }

  // A stream with nothing to send for opt.sse_keepalive (a long prompt, a queue, a pause) gets an SSE comment, which
  // clients ignore, so that a proxy's read timeout (nginx's 60 s) does not cut it before its first token.
  void arm_keepalive(std::uint64_t generation) {
    if (srv_.opt.sse_keepalive.count() <= 0) return;
    keepalive_timer_.expires_at(last_flush_ + srv_.opt.sse_keepalive);
    keepalive_timer_.async_wait([weak = weak_from_this(), generation](beast::error_code ec) {
      const auto self = weak.lock();
      if (ec || !self || generation != self->generation_ || !self->streaming_ || self->ended_ || self->closed_) return;
      if (std::chrono::steady_clock::now() - self->last_flush_ >= self->srv_.opt.sse_keepalive) {
        self->pending_ += self->frame(": keep-alive\n\n");
        self->flush();
        self->last_flush_ = std::chrono::steady_clock::now();  // while a write is still in flight too
      }
      self->arm_keepalive(generation);
    });
  }

  void cancel_jobs() {
    for (auto& job : jobs_) job->cancel();  // the scheduler still sends each its terminal event
  }

  // One choice's event. The request ends when every choice has finished, or at the first failure or cancellation.
  void on_event(std::size_t index, GenerationEvent&& ev) {
    if (jobs_.empty()) return;
    ChoiceState& c = choices_[index];
    switch (ev.kind) {
      case GenerationEvent::Kind::text: {
        if (!ev.prompt_logprobs.empty()) {  // echo: the prompt's own tokens come first
          c.echo_offsets = echo_text_offsets(srv_.tokenizer, ev.prompt_logprobs, c.text);
          if (!streaming_) {
            c.logprobs.insert(c.logprobs.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
            return;
          }
          pending_ += frame(choice_event(stream_chunk(endpoint_, ids_, c.echo_with_logprobs ? c.text : "", "", false,
                                                      logprobs_json(ev.prompt_logprobs, c), static_cast<int>(index))));
          c.echo_offsets.clear();  // sent: the generated tokens' count on from the echoed text's end
          return flush();
        }
        std::string reasoning;
        HarmonyOutput harmony;  // harmony: its calls' pieces, and the calls that ended with this text
        if (c.reasoning) {
          ReasoningSplit split = c.reasoning->push(ev.text);
          reasoning = std::move(split.reasoning);
          ev.text = std::move(split.content);
        }
        if (c.harmony) {
          harmony = c.harmony->push(ev.text);
          reasoning = std::move(harmony.reasoning);
          ev.text = std::move(harmony.content);
        }
        std::vector<ToolCallDelta> deltas;  // the calls' pieces written so far
        if (c.tool_stream) {
          ToolStreamOutput split = c.tool_stream->push(ev.text);
          ev.text = std::move(split.content);
          deltas = std::move(split.calls);
        }
        if (c.required_call) {  // the text is the call object, held by the tool stream
          if (!streaming_) {
            c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
            return;
          }
          emit_deltas(index, deltas, ev.logprobs.empty() ? json(nullptr) : logprobs_json(ev.logprobs, c));
          return flush();
        }
        emit_reasoning(index, c, reasoning);
        if (streaming_) {
          if (c.forced) {
            // The forced call's arguments stream as they are written, without the whitespace outside strings as
            // every call's are; its first piece names it. Its tokens' logprobs ride on the pieces they wrote.
            c.forced_text += ev.text;
            const std::string arguments(c.forced_arguments.push(ev.text));
            const json logprobs = ev.logprobs.empty() ? json(nullptr) : logprobs_json(ev.logprobs, c);
            if (arguments.empty() && c.forced_opened) {
              if (logprobs.is_null()) return;
              pending_ +=
                  frame(choice_event(stream_chunk(endpoint_, ids_, "", "", false, logprobs, static_cast<int>(index))));
              return flush();
            }
            json chunk =
                tool_call_chunk(ids_, static_cast<int>(index), 0, c.forced_opened ? nullptr : &*c.forced, arguments);
            chunk["choices"][0]["logprobs"] = logprobs;
            pending_ += frame(choice_event(std::move(chunk)));
            c.forced_opened = true;
            return flush();
          }
          if (!ev.text.empty() || !ev.logprobs.empty()) {
            pending_ += frame(choice_event(stream_chunk(
                endpoint_, ids_, ev.text, "", false,
                ev.logprobs.empty() ? json(nullptr) : logprobs_json(ev.logprobs, c), static_cast<int>(index))));
          }
          emit_deltas(index, deltas);
          emit_calls(index, c, harmony);
          return flush();
        }
        c.text += ev.text;
        c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
        emit_calls(index, c, harmony);
        return;
      }
      case GenerationEvent::Kind::failed:
        cancel_jobs();
        jobs_.clear();
        if (!streaming_) return respond_error(ev.error, true);
        pending_ += frame("data: " + ev.error.body() + "\n\n");
        return end_stream();
      case GenerationEvent::Kind::finished: break;
    }
    if (ev.finish_reason == "cancelled") {
      cancel_jobs();
      jobs_.clear();
      if (client_gone_) return close_now();
      if (!streaming_) {
        return respond_error(unavailable("The server is shutting down; the request was cancelled."), true);
      }
      pending_ +=
          frame("data: " + unavailable("The server is shutting down; the stream was cancelled.").body() + "\n\n");
      return end_stream();
    }
    c.finish_reason = openai_finish_reason(ev.finish_reason);
    finish_choice_text(index, c);
    // Each prompt counts once; the completions add up; cached: per prompt, what every one of its choices reused.
    auto& pu = prompt_usage_[c.prompt_index];
    if (!pu.counted) usage_.prompt_tokens += ev.prompt_tokens;
    pu.cached_tokens = pu.counted ? std::min(pu.cached_tokens, ev.cached_tokens) : ev.cached_tokens;
    pu.counted = true;
    usage_.completion_tokens += ev.completion_tokens;
    usage_.cached_tokens = 0;
    for (const auto& u : prompt_usage_) usage_.cached_tokens += u.cached_tokens;
    --open_choices_;
    if (streaming_) {
      pending_ += frame(
          choice_event(stream_chunk(endpoint_, ids_, "", c.finish_reason, false, nullptr, static_cast<int>(index))));
    }
    if (open_choices_ > 0) return streaming_ ? flush() : void();
    jobs_.clear();
    if (streaming_) {
      if (include_usage_) pending_ += frame(sse_event(usage_chunk(endpoint_, ids_, usage_)));
      return end_stream();
    }
    std::vector<Choice> choices;
    for (auto& ch : choices_) {
      choices.push_back({ch.text, ch.finish_reason, logprobs_json(ch.logprobs, ch), std::move(ch.calls),
                         std::move(ch.reasoning_text)});
    }
    respond(200,
            completion_response(endpoint_, ids_, choices, usage_).dump(-1, ' ', false, json::error_handler_t::replace),
            "application/json");
  }

  // At a choice's end: what the reasoning split held back is final; the forced call is complete, or the text held
  // back since a call marker is parsed. Streaming sends what is left (reasoning, content, then each call); otherwise
  // it waits in the choice for the response.
  void finish_choice_text(std::size_t index, ChoiceState& c) {
    if (c.harmony) {
      HarmonyOutput rest = c.harmony->finish();
      emit_reasoning(index, c, rest.reasoning);
      emit_content(index, c, rest.content);
      emit_calls(index, c, rest);
      if (c.calls_sent > 0) {
        if (c.finish_reason != "length") c.finish_reason = "tool_calls";  // cut off: the call may be too
        while (!c.text.empty() && std::isspace(static_cast<unsigned char>(c.text.back()))) c.text.pop_back();
      }
      return;
    }
    std::string content;
    if (c.reasoning) {
      ReasoningSplit rest = c.reasoning->finish();
      emit_reasoning(index, c, rest.reasoning);
      content = std::move(rest.content);
    }
    std::vector<ToolCallDelta> deltas;
    if (c.tool_stream) {
      ToolStreamOutput split = c.tool_stream->push(content);
      content = std::move(split.content);
      deltas = std::move(split.calls);
    }
    emit_content(index, c, content);
    emit_deltas(index, deltas);
    if (c.forced) {
      // A call is finished once its arguments are one JSON object (the schema's constraint ends the answer there);
      // cut off before, by max_tokens, a stop string or a stop token, the reason is that cut, never tool_calls.
      const bool whole = json::accept(streaming_ ? c.forced_text : c.text);
      if (streaming_ && !c.forced_opened) emit_call(index, c, 0, *c.forced);  // no arguments were written
      if (!streaming_) {
        c.forced->arguments = minified(std::exchange(c.text, {}));
        c.calls.push_back(*c.forced);
      }
      if (whole && c.finish_reason != "length") c.finish_reason = "tool_calls";
      return;
    }
    if (!c.tool_stream) return;
    // "required": the text is the call object; cut off before it closed, the call with the arguments written so far
    // once it was named (finish_reason the cut's), else the text as content, so nothing is lost.
    ToolStreamEnd end = c.tool_stream->finish();
    ToolParse& parsed = end.parse;
    if (!parallel_tool_calls_ && parsed.calls.size() > 1) parsed.calls.resize(1);
    if (!parsed.calls.empty() && !end.cut_off && !(c.required_call && c.finish_reason == "length")) {
      c.finish_reason = "tool_calls";
    }
    emit_content(index, c, parsed.content);
    if (streaming_) return emit_deltas(index, end.calls);
    if (!parsed.calls.empty()) {
      while (!c.text.empty() && std::isspace(static_cast<unsigned char>(c.text.back()))) c.text.pop_back();
    }
    for (auto& call : parsed.calls) {
      if (call.id.empty()) call.id = tool_call_id(srv_.tool_format, random_u64());
      c.calls.push_back(std::move(call));
    }
  }

  // What a choice says at its end: streamed as a chunk now, or kept in the choice for the response.
  void emit_reasoning(std::size_t index, ChoiceState& c, const std::string& reasoning) {
    if (reasoning.empty()) return;
    if (!streaming_) {
      c.reasoning_text += reasoning;
      return;
    }
    pending_ += frame(choice_event(reasoning_chunk(ids_, static_cast<int>(index), reasoning)));
  }
  void emit_content(std::size_t index, ChoiceState& c, const std::string& content) {
    if (content.empty()) return;
    if (!streaming_) {
      c.text += content;
      return;
    }
    pending_ +=
        frame(choice_event(stream_chunk(endpoint_, ids_, content, "", false, nullptr, static_cast<int>(index))));
  }
  void emit_call(std::size_t index, ChoiceState& c, std::size_t k, ToolCall call) {
    if (!streaming_) {
      c.calls.push_back(std::move(call));
      return;
    }
    pending_ +=
        frame(choice_event(tool_call_chunk(ids_, static_cast<int>(index), static_cast<int>(k), &call, call.arguments)));
  }

  // Streaming: the calls' pieces (a call's first names it, with a new id); only the first call without
  // parallel_tool_calls.
  // `logprobs`: of the tokens that wrote these pieces, sent with the first (alone when there is none).
  void emit_deltas(std::size_t index, const std::vector<ToolCallDelta>& deltas, json logprobs = nullptr) {
    if (!streaming_) return;
    for (const auto& d : deltas) {
      if (!parallel_tool_calls_ && d.index > 0) continue;
      emit_delta(index, d, std::exchange(logprobs, nullptr));
    }
    if (!logprobs.is_null()) {
      pending_ += frame(choice_event(stream_chunk(endpoint_, ids_, "", "", false, logprobs, static_cast<int>(index))));
    }
  }
  void emit_delta(std::size_t index, const ToolCallDelta& d, json logprobs = nullptr) {
    const ToolCall call{d.id.empty() ? tool_call_id(srv_.tool_format, random_u64()) : d.id, d.name, ""};
    json chunk = tool_call_chunk(ids_, static_cast<int>(index), static_cast<int>(d.index),
                                 d.name.empty() ? nullptr : &call, d.arguments);
    chunk["choices"][0]["logprobs"] = std::move(logprobs);
    pending_ += frame(choice_event(std::move(chunk)));
  }

  // Harmony's calls: streamed in pieces as they are written, else each as its message ends. Without
  // parallel_tool_calls only the first complete one (a call that broke before does not count: it was never whole).
  void emit_calls(std::size_t index, ChoiceState& c, HarmonyOutput& out) {
    if (streaming_) {
      for (const auto& d : out.deltas) {
        if (!parallel_tool_calls_ && c.calls_sent > 0) return;
        emit_delta(index, d);
        if (d.last) ++c.calls_sent;
      }
      return;
    }
    for (auto& call : out.calls) {
      if (!parallel_tool_calls_ && c.calls_sent > 0) return;
      if (call.id.empty()) call.id = tool_call_id(srv_.tool_format, random_u64());
      emit_call(index, c, c.calls_sent++, std::move(call));
    }
  }

  // The chat rendered by the model's template into `text` (with the tools when asked for), or the 400 that says why
  // not. With `first`, only the first messages, without the generation prompt (chat::parting_positions).
  std::optional<ApiError> chat_prompt(const CompletionRequest& req, bool add_generation_prompt, std::string& text,
                                      std::optional<std::size_t> first = std::nullopt) {
    if (!srv_.chat_template) {
      if (!srv_.chat_config.template_origin.empty()) {  // there is one, but it does not parse (said at start)
        return bad_request("This model's chat template (" + srv_.chat_config.template_origin +
                           ") does not parse; use /v1/completions, or start the server with --chat-template.");
      }
      return bad_request(
          "This model has no chat template (tokenizer_config.json chat_template); use /v1/completions, or start the "
          "server with --chat-template.");
    }
    chat::RenderOptions ro;
    ro.add_generation_prompt = add_generation_prompt && !req.continue_final_message && !first;
    ro.bos_token = srv_.chat_config.bos_token;
    ro.eos_token = srv_.chat_config.eos_token;
    ro.extra = req.template_kwargs;
    // "none" reads no call, so any template will do; its tools are still shown unless the server says otherwise.
    if (req.tool_choice != CompletionRequest::ToolChoice::none) {
      if (auto e = check_tools_usable()) return *e;
      ro.tools = req.tools;
    } else if (!srv_.opt.exclude_tools_when_tool_choice_none) {
      ro.tools = req.tools;
    }
    const bool continues = req.continue_final_message && !first;
    nlohmann::ordered_json messages =
        first ? nlohmann::ordered_json(req.messages.begin(), req.messages.begin() + static_cast<long>(*first))
              : req.messages;
    if (continues) {
      auto& content = messages.back()["content"];
      content = (content.is_string() ? content.get<std::string>() : "") + std::string(kContinueMarker);
    }
    // As transformers' apply_chat_template: the "tool_use" template of a named list when there are tools.
    const bool tools = !ro.tools.is_null() && !ro.tools.empty();
    auto rendered =
        render_chat(tools && srv_.tool_use_template ? *srv_.tool_use_template : *srv_.chat_template, messages, ro);
    if (!rendered) {
      return bad_request("The chat template rejected the messages: " + rendered.error().message(), "messages",
                         "invalid_value");
    }
    text = std::move(*rendered);
    if (continues) {
      const auto at = text.rfind(kContinueMarker);
      if (at == std::string::npos) {
        return bad_request(
            "The chat template does not write the final message's content as given, so it cannot be "
            "continued.",
            "continue_final_message", "invalid_value");
      }
      text.resize(at);
    }
    return std::nullopt;
  }

  // Tools asked for, but the template cannot show them to the model or its calls are in no syntax colibri reads.
  std::optional<ApiError> check_tools_usable() const {
    const std::string origin =
        srv_.chat_config.template_origin.empty() ? "--chat-template" : srv_.chat_config.template_origin;
    if (!srv_.template_reads_tools) {
      return bad_request("The chat template (" + origin +
                             ") does not show tool definitions to the model, so 'tools' cannot be used with it. "
                             "Start colibri-server with --chat-template FILE, a template that renders 'tools'.",
                         "tools", "unsupported_value");
    }
    if (srv_.tool_format == ToolFormat::none) {
      return bad_request("The chat template (" + origin + ") writes tool calls in no syntax colibri reads (" +
                             supported_tool_formats() +
                             "), so their calls could not be returned. Start colibri-server with --chat-template "
                             "FILE, a template whose calls colibri reads, or send 'tool_choice': 'none'.",
                         "tools", "unsupported_value");
    }
    return std::nullopt;
  }

  static std::uint64_t random_u64() {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
  }

  // A stream's piece: a chunk, or the bytes as they are to an HTTP/1.0 client (which knows no chunked encoding:
  // the stream ends when the connection closes).
  std::string frame(std::string_view data) const { return http10_ ? std::string(data) : chunk(data); }

  void end_stream() {
    keepalive_timer_.cancel();
    pending_ += frame(kSseDone);
    if (!http10_) pending_ += "0\r\n\r\n";
    ended_ = true;
    flush();
  }

  void flush() {
    if (writing_ || pending_.empty() || closed_) return;
    writing_ = true;
    last_flush_ = std::chrono::steady_clock::now();
    auto data = std::make_shared<std::string>(std::move(pending_));
    pending_.clear();
    stream_.expires_after(srv_.opt.write_timeout);
    net::async_write(stream_, net::buffer(*data), [self = shared_from_this(), data](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      self->stream_.expires_never();
      if (ec) {
        self->client_gone_ = true;
        self->cancel_jobs();
        return self->close_now();
      }
      if (!self->pending_.empty()) return self->flush();
      if (self->ended_ && self->jobs_.empty()) {
        self->ended_ = false;
        self->streaming_ = false;
        if (self->keep_alive_ && !self->srv_.stopping) return self->read_request();
        return self->close_graceful();
      }
    });
  }

  // While a job runs, a readable socket means EOF (client gone) or a pipelined request (left in the socket).
  void watch_disconnect() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->jobs_.empty() || self->closed_) return;
      char c;
      const auto n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        self->client_gone_ = true;
        self->cancel_jobs();
        return;
      }
      if (n < 0) self->watch_disconnect();
    });
  }

  // --- plain responses ------------------------------------------------------------------------------------------

  void respond_error(const ApiError& e, bool close) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(e.status), 11);
    if (e.status == 401) res->set(http::field::www_authenticate, "Bearer");
    // Busy (a full queue, every connection taken, out of descriptors): come back soon. Shutting down is not busy.
    if (e.status == 429 || e.code == "too_many_connections" || e.code == "temporarily_unavailable")
      res->set(http::field::retry_after, "1");
    if (e.status == 405 && !allow_.empty()) res->set(http::field::allow, allow_);
    send(res, e.status, e.body(), "application/json", close);
  }

  void respond(int status, std::string body, const char* content_type) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    send(res, status, std::move(body), content_type, false);
  }

  void send(const std::shared_ptr<http::response<http::string_body>>& res, int status, std::string body,
            const char* content_type, bool close) {
    if (closed_) return;
    responding_ = true;
    srv_.count(route_, status);
    const bool keep = keep_alive_ && !close && !srv_.stopping;
    res->version(request_.version() == 10 ? 10 : 11);
    res->set(http::field::server, "colibri");
    res->set(http::field::content_type, content_type);
    add_answer_headers(*res);
    res->keep_alive(keep);
    res->body() = std::move(body);
    res->prepare_payload();
    stream_.expires_after(srv_.opt.write_timeout);
    if (request_.method() == http::verb::head) {  // the header fields as a GET gets them, Content-Length included
      auto head = std::make_shared<http::response<http::empty_body>>();
      head->base() = res->base();
      return write_answer(head, keep);
    }
    write_answer(res, keep);
  }

  template <class Body>
  void write_answer(const std::shared_ptr<http::response<Body>>& res, bool keep) {
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep](beast::error_code ec, std::size_t) {
      self->responding_ = false;
      self->stream_.expires_never();
      if (ec) return self->close_now();
      if (keep) return self->read_request();
      self->close_graceful();
    });
  }

  // Half-close, then drain what the client still sends (bounded) so our response is not lost to a reset.
  void close_graceful() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close_now();
    stream_.expires_after(std::chrono::seconds(2));
    drain();
  }

  void drain() {
    auto buf = std::make_shared<std::array<char, 4096>>();
    stream_.async_read_some(net::buffer(*buf), [self = shared_from_this(), buf](beast::error_code ec, std::size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (16u << 20)) return self->close_now();
      self->drain();
    });
  }

  void close_now() {
    if (closed_) return;
    closed_ = true;
    read_deadline_.cancel();
    keepalive_timer_.cancel();
    cancel_jobs();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  Server::Impl& srv_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::string route_ = "other";
  bool between_requests_ = false;  // waiting for a keep-alive connection's next request
  bool first_ = true, idle_ = false, keep_alive_ = false, closed_ = false, responding_ = false, http10_ = false;
  std::string allow_;                  // a 405's Allow header
  std::string request_id_;             // x-request-id of this request's answer
  net::steady_timer read_deadline_;    // a request's (or keep-alive wait's) time to arrive
  net::steady_timer keepalive_timer_;  // a stream's next SSE comment, while nothing else is sent (arm_keepalive)
  std::chrono::steady_clock::time_point last_flush_{};
  bool read_timed_out_ = false, read_done_ = true;
  std::uint64_t reads_ = 0;  // numbers the deadlines, so that a stale one is ignored
  std::uint64_t drained_ = 0;
  // The generation in flight: one job per choice (empty when none).
  std::vector<std::shared_ptr<Job>> jobs_;
  std::uint64_t generation_ = 0;  // numbers this connection's requests; events of an earlier one are dropped
  struct ChoiceState {
    std::size_t prompt_index = 0;  // completions batch: the prompt this choice continues
    std::string text;
    std::string finish_reason;
    std::vector<engine::TokenLogprob> logprobs;  // non-streaming: every generated token's, for the response
    std::int64_t text_offset = 0;                // completions: where the next token starts in the choice's text
    std::vector<std::int64_t> echo_offsets;      // completions with echo: where each prompt token starts in it
    bool echo_with_logprobs = false;             // streaming: the echoed text goes out with the prompt's logprobs
    std::optional<ToolCallStream> tool_stream;   // tool_choice auto or required: splits content from calls
    std::optional<ToolCall> forced;              // tool_choice naming a function: the call the text is arguments of
    bool forced_opened = false;                  // streaming: the forced call's first piece was sent
    JsonMinifier forced_arguments;               // streaming: the forced call's arguments so far
    std::string forced_text;                     // streaming: ... as the model wrote them
    bool required_call = false;                  // tool_choice "required" with several tools: the text is the call
    std::vector<ToolCall> calls;                 // non-streaming: the message's tool_calls
    std::optional<ReasoningStream> reasoning;    // a thinking model: splits its <think> block from the content
    std::string reasoning_text;                  // non-streaming: the message's reasoning_content
    std::optional<HarmonyStream> harmony;        // a harmony model: splits its channels (and calls, with tools)
    std::size_t calls_sent = 0;                  // harmony: the complete calls emitted so far
  };
  std::vector<ChoiceState> choices_;
  struct PromptUsage {
    bool counted = false;  // a choice of this prompt finished: its prompt tokens are in usage_
    std::int64_t cached_tokens = 0;
  };
  std::vector<PromptUsage> prompt_usage_;
  std::size_t open_choices_ = 0;
  Usage usage_;
  Endpoint endpoint_ = Endpoint::chat;
  ResponseIds ids_;
  bool streaming_ = false, include_usage_ = false, client_gone_ = false, ended_ = false, writing_ = false;
  std::string pending_;
  bool logprobs_wanted_ = false;
  bool parallel_tool_calls_ = true;

  // A streamed chunk with choices; with stream_options.include_usage it carries "usage": null, as OpenAI's do
  // (only the last chunk, with no choices, has the numbers).
  std::string choice_event(nlohmann::json data) const {
    if (include_usage_) data["usage"] = nullptr;
    return sse_event(data);
  }

  nlohmann::json logprobs_json(const std::vector<engine::TokenLogprob>& tokens, ChoiceState& choice) {
    if (!logprobs_wanted_) return nullptr;
    return logprobs_object(
        endpoint_, tokens, [this](std::int32_t id) { return srv_.tokenizer.token_bytes(id).value_or(""); },
        choice.text_offset, choice.echo_offsets);
  }
};

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (ec == net::error::no_descriptors) {
        // Out of file descriptors: said once per shortage, not ten times a second; wait a moment instead of spinning.
        if (!out_of_descriptors.exchange(true)) {
          spdlog::warn(
              "out of file descriptors (ulimit -n): new connections wait until others close; raise the "
              "limit (LimitNOFILE= in a systemd unit) or lower --max-connections");
        }
        auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
        t->async_wait([this, t](beast::error_code) { accept(); });
        return;
      }
      spdlog::warn("accept failed: {}", ec.message());
      return accept();
    }
    if (out_of_descriptors.exchange(false)) spdlog::info("accepting connections again");
    std::size_t live;
    std::vector<std::shared_ptr<Session>> reclaim;
    {
      std::lock_guard lock(mu);
      live = sessions.size();
      if (live >= opt.max_connections) {
        for (auto& [p, w] : sessions) {
          if (auto s = w.lock()) reclaim.push_back(std::move(s));
        }
      }
    }
    // Full: this client is told to retry (Retry-After), and idle keep-alive connections make room for it.
    for (auto& s : reclaim) net::post(s->executor(), [s] { s->close_if_idle_keep_alive(); });
    std::make_shared<Session>(std::move(socket), *this)->start(live >= opt.max_connections);
    accept();
  });
}

void Server::Impl::stop() {
  if (stopping.exchange(true)) return;
  spdlog::info("stopping: no new requests; streams get {} ms to finish", opt.drain_timeout.count());
  net::post(ioc, [this] {
    beast::error_code ec;
    acceptor.close(ec);
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard lock(mu);
      for (auto& [p, w] : sessions) {
        if (auto s = w.lock()) live.push_back(std::move(s));
      }
    }
    // Idle keep-alive connections close now; busy ones after their response.
    for (auto& s : live) net::post(s->executor(), [s] { s->close_if_idle(); });
  });
  // Assigned under mu: the thread can stop the io_context, and so end run(), before the assignment is done.
  std::lock_guard lock(mu);
  drainer = std::thread([this] {
    scheduler->shutdown(opt.drain_timeout);  // every job has had its terminal event after this
    net::post(ioc, [this] {
      std::vector<std::shared_ptr<Session>> live;
      {
        std::lock_guard lock(mu);
        for (auto& [p, w] : sessions) {
          if (auto s = w.lock()) live.push_back(std::move(s));
        }
      }
      for (auto& s : live) net::post(s->executor(), [s] { s->close_if_idle(); });
      live.clear();
      work.reset();
      // Responses still being written get a bounded time. A single timer for all of it kept the process up for
      // the whole write timeout whenever a session was still closing at this moment.
      stop_when_sessions_end(std::chrono::steady_clock::now() + opt.write_timeout);
    });
  });
}

// The first signal drains (--drain-timeout); a second one, as llama-server's second Ctrl-C, stops now.
void Server::Impl::wait_for_signal() {
  signals.async_wait([this](beast::error_code ec, int sig) {
    if (ec) return;
    const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGINT";
    if (!stopping) {
      spdlog::info("received {}; a second one stops at once", name);
      stop();
      wait_for_signal();
      return;
    }
    spdlog::warn("received {} again: stopping now, cancelling what still runs", name);
    hurry = true;
    scheduler->end_grace();
  });
}

void Server::Impl::stop_when_sessions_end(std::chrono::steady_clock::time_point deadline) {
  bool open = false;
  {
    std::lock_guard lock(mu);
    for (auto& [p, w] : sessions) open = open || !w.expired();
  }
  if (!open || hurry || std::chrono::steady_clock::now() >= deadline) return ioc.stop();
  auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(20));
  t->async_wait([this, t, deadline](beast::error_code) { stop_when_sessions_end(deadline); });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (!impl_) return;
  impl_->stop();
  impl_->join_drainer();
  impl_->scheduler->shutdown(std::chrono::milliseconds(0));
}

namespace {

// Resolves and binds `acceptor` to host:port, listening; the error names the address.
sdk::Status listen_on(tcp::acceptor& acceptor, net::io_context& ioc, const std::string& host, std::uint16_t port) {
  const std::string where = host + ":" + std::to_string(port);
  try {
    tcp::resolver resolver(ioc);
    auto results =
        resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service);
    if (results.empty())
      return sdk::Status(sdk::StatusCode::invalid_argument, "--host " + host + " resolves to no address");
    const tcp::endpoint ep = results.begin()->endpoint();
    acceptor.open(ep.protocol());
    acceptor.set_option(net::socket_base::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    return sdk::Status(sdk::StatusCode::io_error,
                       "cannot listen on " + where + ": " + e.code().message() + " (choose another --host/--port)");
  }
  return {};
}

}  // namespace

sdk::Status Server::check_address(const std::string& host, std::uint16_t port) {
  net::io_context ioc;
  tcp::acceptor probe(ioc);
  return listen_on(probe, ioc, host, port);
}

sdk::Expected<std::unique_ptr<Server>> Server::create(std::unique_ptr<engine::Engine> engine,
                                                      tokenizer::Tokenizer tokenizer,
                                                      std::optional<chat::Template> chat_template,
                                                      chat::ChatConfig chat_config, ServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(tokenizer));
  impl->engine = std::move(engine);
  impl->chat_template = std::move(chat_template);
  impl->chat_config = std::move(chat_config);
  if (impl->chat_template && !impl->chat_config.tool_use_source.empty()) {
    auto t =
        chat::Template::parse(impl->chat_config.tool_use_source, impl->chat_config.template_origin + " (tool_use)");
    if (t) {
      impl->tool_use_template = std::move(*t);
      spdlog::info("chat template: its \"tool_use\" template renders the requests with tools");
    } else {
      spdlog::warn("the model's \"tool_use\" chat template does not parse ({}); requests with tools use \"default\"",
                   t.error().message());
    }
  }
  // Calls are written as the template that renders the tools writes them.
  const std::string& tools_source =
      impl->tool_use_template ? impl->chat_config.tool_use_source : impl->chat_config.template_source;
  impl->tool_format = detect_tool_format(tools_source);
  impl->template_reads_tools = template_reads_tools(tools_source);
  // Whether a tag is special is the tokenizer's to say (GLM's <arg_key> is, Qwen's <tool_call> is not).
  for (const std::string_view marker : tool_markers(impl->tool_format)) {
    const auto id = impl->tokenizer.piece_to_token(marker);
    if (id && impl->tokenizer.is_special(*id)) impl->tool_markers_special = true;
  }
  if (impl->chat_template && impl->tool_format != ToolFormat::none) {
    spdlog::info("tool calls: read in the chat template's {} syntax{}", tool_format_name(impl->tool_format),
                 impl->tool_markers_special ? " (its tags are special tokens: kept in the decoded answer)" : "");
  }
  impl->opt = std::move(options);
  impl->harmony = template_is_harmony(impl->chat_config.template_source);
  impl->split_reasoning =
      impl->opt.separate_reasoning && !impl->harmony && template_has_reasoning(impl->chat_config.template_source);
  impl->answer_tags = impl->split_reasoning && impl->engine->hparams().architecture == "hunyuan_moe";
  if (impl->answer_tags) spdlog::info("answers: the content is what Hunyuan's <answer> tags hold (the tags dropped)");
  if (impl->harmony) {
    // Harmony ends an answer with <|return|>, or <|call|> after a call: gpt-oss lists <|call|> only in its
    // generation_config.json, so the model's config alone would let the answer run on past its call.
    for (const std::string_view name : kHarmonyEndTokens) {
      if (const auto id = impl->tokenizer.piece_to_token(name)) impl->opt.scheduler.end_tokens.push_back(*id);
    }
  }
  if (impl->opt.model_name.empty()) impl->opt.model_name = impl->engine->model_dir().filename().string();
  // The name goes into every JSON answer, which must be UTF-8: a directory named in another encoding is repaired
  // (U+FFFD for the bytes that are not), and said so.
  if (!tokenizer::utf8::is_valid(impl->opt.model_name)) {
    const std::string repaired = tokenizer::utf8::to_valid_lossy(impl->opt.model_name);
    spdlog::warn("the model's name is not UTF-8; clients see it as '{}' (--served-model-name gives another)", repaired);
    impl->opt.model_name = repaired;
  }
  if (auto st = listen_on(impl->acceptor, impl->ioc, impl->opt.host, impl->opt.port); !st) return st;
  // Without --usage-history the model's own history file: the one run and bench merge into, `cache stats --model`
  // shows and /admin/cache/warm reads, so a server's traffic counts there too.
  if (impl->opt.scheduler.usage_history.empty()) {
    impl->opt.scheduler.usage_history = engine::usage_history_path(impl->engine->model_dir());
    // Written at exit: a cache directory that cannot take it is said now, not after a day's counts are lost.
    std::error_code ec;
    std::filesystem::create_directories(impl->opt.scheduler.usage_history.parent_path(), ec);
    if (ec) {
      spdlog::warn("the expert usage history cannot be saved to {}: {}; give --usage-history FILE to keep it elsewhere",
                   impl->opt.scheduler.usage_history.string(), ec.message());
    }
  }
  impl->scheduler = std::make_unique<Scheduler>(*impl->engine, impl->tokenizer, impl->opt.scheduler);
  // Caught from now on (asio queues one that comes before run() waits): a caller that announces the server once it
  // is created, and a supervisor that stops it at once, must not kill it without its drain and history.
  if (impl->opt.handle_signals) {
    impl->signals.add(SIGTERM);
    impl->signals.add(SIGINT);
    impl->signals.add(SIGHUP);  // its terminal closed: drain and save the usage history, as SIGTERM
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

const std::string& Server::model_name() const {
  return impl_->opt.model_name;
}

std::uint16_t Server::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void Server::stop() {
  impl_->stop();
}

void Server::run() {
  auto& s = *impl_;
  s.work.emplace(s.ioc.get_executor());
  if (s.opt.handle_signals) s.wait_for_signal();  // added in create()
  s.accept();
  auto worker = [&s] {
    for (;;) {
      try {
        s.ioc.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("HTTP handler error: {}", e.what());  // one connection's problem; keep serving
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, s.opt.io_threads); ++i) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  s.join_drainer();
  s.scheduler->shutdown(std::chrono::milliseconds(0));
  std::lock_guard lock(s.mu);
  s.sessions.clear();
}

}  // namespace colibri::server
