// The EC2 Query API over libcurl: one action in (its parameters), the parsed XML response out
// (pugixml). Every request is SigV4-signed (sigv4.hpp), has a timeout, and is retried with
// exponential backoff and full jitter when the failure is one a retry can cure (a connection
// error, a timeout, HTTP 5xx, throttling); any other AWS error is thrown at once as an ApiError
// whose message names the action, the code and what to do (docs/providers.md, "aws: errors").
// A response body is held in memory only up to max_response_bytes: a longer one stops the
// transfer there and is an ApiError (code "ResponseTooLarge"), never retried.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pugixml.hpp>

#include "aws_config.hpp"

namespace skyforge::aws {

struct ApiError : std::runtime_error {
  ApiError(const std::string& what, std::string action, std::string code, std::string aws_message, long status)
      : std::runtime_error(what),
        action(std::move(action)),
        code(std::move(code)),
        aws_message(std::move(aws_message)),
        http_status(status) {}
  std::string action;       // "RunInstances"
  std::string code;         // "UnauthorizedOperation"; "" for a transport failure
  std::string aws_message;  // AWS's own text
  long http_status = 0;     // 0: no response
};

// The largest response body the client reads (ClientOptions::max_response_bytes): EC2's largest
// answers, a page of DescribeInstances or a filtered DescribeImages, are a few MiB; an endpoint
// that sends more is not EC2 or is broken, and is cut off here instead of filling memory.
inline constexpr size_t kMaxResponseBytes = size_t(64) << 20;  // 64 MiB

struct ClientOptions {
  std::chrono::milliseconds timeout{30'000};          // one HTTP request, connect included
  std::chrono::milliseconds connect_timeout{10'000};
  int max_attempts = 8;                               // per call, the first one included
  std::chrono::milliseconds backoff_base{200};        // attempt n waits U(0, min(cap, base * 2^n))
  std::chrono::milliseconds backoff_cap{20'000};
  std::chrono::milliseconds deadline{180'000};        // no retry starts after this much time in one call
  std::function<void(const std::string&)> on_retry;   // one line per retry, for the user
  std::string service = "ec2";         // the signing name; "iam" with api_version 2010-05-08 for IAM
  std::string api_version = "2016-11-15";
  size_t max_response_bytes = kMaxResponseBytes;      // a longer body: ApiError "ResponseTooLarge"
};

using QueryParams = std::vector<std::pair<std::string, std::string>>;

class Ec2Client {
 public:
  Ec2Client(ResolvedAws aws, ClientOptions options = {});
  ~Ec2Client();
  Ec2Client(const Ec2Client&) = delete;
  Ec2Client& operator=(const Ec2Client&) = delete;

  // The action's response document. Throws ApiError. `max_attempts` > 0 overrides the
  // options' for this call (1: no retry, the caller decides).
  pugi::xml_document call(const std::string& action, const QueryParams& params = {}, int max_attempts = 0);

  const ResolvedAws& aws() const { return aws_; }
  const ClientOptions& options() const { return options_; }
  size_t requests() const;  // HTTP requests sent (every attempt), for the figures

 private:
  // A response body, never over the client's limit: grown with realloc(), which for a large block
  // remaps its pages (glibc: mremap) rather than copying them, so holding a body costs about its
  // size, not twice (measured: +64 MiB peak RSS for a body cut at 64 MiB).
  class Body {
   public:
    Body() = default;
    Body(const Body&) = delete;
    Body& operator=(const Body&) = delete;
    Body(Body&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)), cap_(std::exchange(o.cap_, 0)) {}
    ~Body();
    // Appends unless the body would pass `limit` (or memory runs out): then false, nothing added.
    bool append(const char* data, size_t n, size_t limit);
    void release();
    const char* data() const { return p_; }
    size_t size() const { return size_; }

   private:
    char* p_ = nullptr;
    size_t size_ = 0, cap_ = 0;
  };
  struct Response {
    long status = 0;
    Body body;
    std::string transport_error;  // libcurl's, when no response came
    bool too_large = false;       // the body passed max_response_bytes: the transfer was stopped
  };
  Response post(const std::string& body);
  static size_t collect(char* data, size_t size, size_t n, void* sink);  // libcurl's write callback

  ResolvedAws aws_;
  ClientOptions options_;
  std::string url_, host_header_;
  mutable std::mutex mu_;
  void* curl_ = nullptr;  // CURL*, reused so the connection is kept alive
  size_t requests_ = 0;
};

// Whether a retry can cure an AWS error code (throttling, capacity of the service itself).
bool retryable_code(const std::string& code);
// The message an ApiError carries: the action, the code, AWS's text and what to do.
std::string explain(const std::string& action, const std::string& code, const std::string& message,
                    const ResolvedAws& aws);
// "a=b&c=d", keys and values percent-encoded as SigV4 wants.
std::string form_encode(const QueryParams& params);

}  // namespace skyforge::aws
