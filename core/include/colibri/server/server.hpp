// colibri-server: the OpenAI-compatible HTTP API (Boost.Beast on an Asio io_context) in front of the scheduler.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colibri/chat/template.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/sdk/status.hpp"
#include "colibri/server/api.hpp"
#include "colibri/server/scheduler.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;  // 0: any free port (see Server::port())
  std::string api_key;        // non-empty: /v1 and /admin need "Authorization: Bearer <key>"
  // Browser pages whose Origin may call the API (CORS): exact origins ("http://localhost:3000") or "*" for any.
  // Empty: no CORS headers, so browsers keep other sites' pages from reading the answers.
  std::vector<std::string> allowed_origins;
  std::string model_name;  // what /v1/models lists and requests must name
  std::uint64_t max_body_bytes = 4u << 20;
  std::uint32_t max_header_bytes = 16u << 10;
  std::chrono::milliseconds request_timeout{15000};  // to receive one request's header and body (slow clients)
  std::chrono::milliseconds idle_timeout{60000};     // keep-alive connection with no request
  std::chrono::milliseconds write_timeout{60000};    // one response write to a client that does not read
  std::chrono::milliseconds drain_timeout{10000};    // SIGTERM: time streams get to finish before being cancelled
  // A stream with nothing to send for this long gets an SSE comment line (": keep-alive"), which clients ignore, so
  // that proxies' read timeouts do not cut it during a long prompt, a queue or a pause; 0: never.
  std::chrono::milliseconds sse_keepalive{15000};
  std::size_t max_connections = 256;
  int io_threads = 2;
  bool handle_signals = true;  // SIGTERM/SIGINT stop the server
  // A template whose model thinks in <think> blocks: the block is returned as reasoning_content (else left inline).
  bool separate_reasoning = true;
  // tool_choice "none": the tools still reach the template (as vLLM >= 0.10), so the prompt keeps the prefix of the
  // turns that offered them (the KV cache is reused) and the model knows what it may not call. true: left out.
  bool exclude_tools_when_tool_choice_none = false;
  // Sampling fields a request leaves out: the model's generation_config.json values (as vLLM), else OpenAI's.
  SamplingDefaults sampling_defaults;
  SchedulerOptions scheduler;
};

class Server {
 public:
  // Binds the listening socket (errors name the address) and starts the scheduler. `chat_template` may be empty:
  // then /v1/chat/completions answers 400 and /v1/completions still works.
  // Binds host:port once and lets it go: run before the model loads, so that a port in use or a bad --host fails
  // in a moment, not after minutes of loading. create() binds for real.
  static sdk::Status check_address(const std::string& host, std::uint16_t port);
  static sdk::Expected<std::unique_ptr<Server>> create(std::unique_ptr<engine::Engine> engine,
                                                       tokenizer::Tokenizer tokenizer,
                                                       std::optional<chat::Template> chat_template,
                                                       chat::ChatConfig chat_config, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  [[nodiscard]] std::uint16_t port() const;
  // The name clients send (the model directory's unless --served-model-name gave one), as UTF-8.
  [[nodiscard]] const std::string& model_name() const;
  // Serves until stop() or a signal; then drains streams (drain_timeout), saves the usage history and returns.
  void run();
  // Thread-safe; also what SIGTERM does.
  void stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prometheus text exposition of the server's counters, the scheduler and expert-cache statistics and the
// process-wide util::Metrics values. `http_requests` maps {route, status} to counts.
std::string render_metrics(const SchedulerStats& stats,
                           const std::map<std::pair<std::string, int>, std::uint64_t>& http_requests,
                           const std::string& model_name, double uptime_seconds);

}  // namespace colibri::server
