// A small blocking HTTP/1.1 client for talking to a running colibri-server (colibri-cli cache --server URL).
// Plain HTTP only, one request per connection. Boost.Beast stays inside http_client.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "colibri/sdk/status.hpp"

namespace colibri::server {

struct HttpUrl {
  std::string text;  // as given, for messages
  std::string host;  // IPv6 without brackets
  std::uint16_t port = 80;
  std::string base_path;  // "" or "/prefix" (no trailing slash); request paths are appended
};

// "http://host[:port][/prefix]"; "host:port" without a scheme means http. Errors name the URL and what is wrong.
sdk::Expected<HttpUrl> parse_http_url(std::string_view url);

struct HttpResponse {
  int status = 0;
  std::string body;
};

struct HttpRequestOptions {
  std::string bearer_token;                       // non-empty: "Authorization: Bearer <token>"
  std::chrono::milliseconds timeout{10 * 60000};  // the whole exchange (warming a big cache takes a while)
};

// Sends one request and reads the whole response. Errors (cannot resolve, connection refused, timeout) name the
// URL; a refused connection says to start colibri-server. Any HTTP status is a response, not an error.
sdk::Expected<HttpResponse> http_request(const HttpUrl& url, std::string_view method, std::string_view path,
                                         std::string_view body, const HttpRequestOptions& options = {});

}  // namespace colibri::server
