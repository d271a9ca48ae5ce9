// The client side of colibri-server's HTTP (colibri-cli cache --server). Beast is confined to this TU and
// http_server.cpp; both define BOOST_BEAST_USE_STD_STRING_VIEW the same way.
#define BOOST_BEAST_USE_STD_STRING_VIEW 1

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>
// clang-format on

#include "colibri/server/http_client.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

namespace colibri::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using sdk::Status;
using sdk::StatusCode;

namespace {

Status bad_url(std::string_view url, const std::string& why) {
  return Status(StatusCode::invalid_argument,
                "bad server URL '" + std::string(url) + "': " + why + " (write it like http://127.0.0.1:8080)");
}

bool host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

}  // namespace

sdk::Expected<HttpUrl> parse_http_url(std::string_view url) {
  HttpUrl out;
  out.text = std::string(url);
  std::string_view rest = url;
  if (const auto scheme_end = rest.find("://"); scheme_end != std::string_view::npos) {
    const auto scheme = rest.substr(0, scheme_end);
    if (scheme == "https") return bad_url(url, "https is not supported; colibri-server speaks plain http");
    if (scheme != "http") return bad_url(url, "the scheme must be http");
    rest.remove_prefix(scheme_end + 3);
  }
  if (rest.find_first_of("?#") != std::string_view::npos) return bad_url(url, "a query or fragment is not allowed");
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash);
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    out.base_path = std::string(path);
  }
  if (authority.find('@') != std::string_view::npos) return bad_url(url, "user information is not supported");
  std::string_view port;
  if (authority.starts_with("[")) {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) return bad_url(url, "an IPv6 address needs its closing ']'");
    out.host = std::string(authority.substr(1, close - 1));
    const auto after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad_url(url, "expected ':PORT' after the IPv6 address");
      port = after.substr(1);
      if (port.empty()) return bad_url(url, "the port is empty");
    }
    if (out.host.empty()) return bad_url(url, "the host is empty");
  } else {
    const auto colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad_url(url, "the port is empty");
    }
    if (out.host.empty()) return bad_url(url, "the host is empty");
    for (const char c : out.host) {
      if (!host_char(c)) return bad_url(url, "the host '" + out.host + "' has a character a host name cannot have");
    }
  }
  if (!port.empty()) {
    std::uint32_t p = 0;
    for (const char c : port) {
      if (c < '0' || c > '9' || p > 65535) return bad_url(url, "the port '" + std::string(port) + "' is not 1..65535");
      p = p * 10 + static_cast<std::uint32_t>(c - '0');
    }
    if (p == 0 || p > 65535) return bad_url(url, "the port '" + std::string(port) + "' is not 1..65535");
    out.port = static_cast<std::uint16_t>(p);
  }
  return out;
}

sdk::Expected<HttpResponse> http_request(const HttpUrl& url, std::string_view method, std::string_view path,
                                         std::string_view body, const HttpRequestOptions& options) {
  const std::string where = url.text;
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  const auto endpoints = resolver.resolve(url.host, std::to_string(url.port), tcp::resolver::numeric_service, ec);
  if (ec)
    return Status(StatusCode::io_error, "cannot resolve the host '" + url.host + "' of " + where + ": " + ec.message() +
                                            "; check the name, or give the server's address (http://127.0.0.1:8080)");

  http::request<http::string_body> req;
  req.method(http::string_to_verb(method));
  if (req.method() == http::verb::unknown) {
    return Status(StatusCode::invalid_argument, "unknown HTTP method " + std::string(method));
  }
  req.target(url.base_path + std::string(path));
  req.version(11);
  const bool v6 = url.host.find(':') != std::string::npos;
  req.set(http::field::host, (v6 ? "[" + url.host + "]" : url.host) + ":" + std::to_string(url.port));
  req.set(http::field::user_agent, "colibri-cli");
  req.set(http::field::connection, "close");
  if (!options.bearer_token.empty()) req.set(http::field::authorization, "Bearer " + options.bearer_token);
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.body() = std::string(body);
  req.prepare_payload();

  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  std::optional<beast::error_code> failure;
  const char* stage = "connect to";
  stream.expires_after(options.timeout);
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
    if (e) return failure.emplace(e), void();
    stage = "send the request to";
    http::async_write(stream, req, [&](beast::error_code e2, std::size_t) {
      if (e2) return failure.emplace(e2), void();
      stage = "read the answer of";
      http::async_read(stream, buffer, parser, [&](beast::error_code e3, std::size_t) {
        if (e3) failure.emplace(e3);
      });
    });
  });
  ioc.run();
  if (failure) {
    const auto e = *failure;
    if (e == net::error::connection_refused) {
      return Status(StatusCode::io_error, "cannot connect to " + where +
                                              ": connection refused. Is colibri-server running there? Start it with "
                                              "colibri-server --model MODEL --port " +
                                              std::to_string(url.port));
    }
    if (e == beast::error::timeout) {
      return Status(StatusCode::io_error,
                    "cannot " + std::string(stage) + " " + where + ": no answer within " +
                        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options.timeout).count()) +
                        " s");
    }
    return Status(StatusCode::io_error, "cannot " + std::string(stage) + " " + where + ": " + e.message());
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  HttpResponse out;
  out.status = static_cast<int>(parser.get().result_int());
  out.body = std::move(parser.get().body());
  return out;
}

}  // namespace colibri::server
