#include "ec2_client.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace skyforge::aws {
namespace {

// "64 MiB", or the bytes when not a whole number of MiB.
std::string size_text(size_t bytes) {
  if (bytes >= (size_t(1) << 20) && bytes % (size_t(1) << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

// libcurl's global state, set up once before any handle (it is not thread-safe itself).
void curl_global() {
  static const bool ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!ok) throw std::runtime_error("aws: libcurl failed to initialise");
}

// "https://host:port/path" -> "host:port" (what the Host header says, and what is signed).
std::string authority_of(const std::string& url) {
  size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  size_t end = url.find('/', start);
  return url.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

std::string path_of(const std::string& url) {
  size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  size_t slash = url.find('/', start);
  return slash == std::string::npos ? "/" : url.substr(slash);
}

bool retryable_transport(long status, const std::string& transport_error) {
  return !transport_error.empty() || status >= 500 || status == 429;
}

}  // namespace

Ec2Client::Body::~Body() { release(); }

void Ec2Client::Body::release() {
  std::free(p_);
  p_ = nullptr;
  size_ = cap_ = 0;
}

bool Ec2Client::Body::append(const char* data, size_t n, size_t limit) {
  if (n > limit - std::min(limit, size_)) return false;
  if (size_ + n > cap_) {
    const size_t want = std::min(limit, std::max({size_ + n, 2 * cap_, size_t(64) << 10}));
    char* grown = static_cast<char*>(std::realloc(p_, want));
    if (!grown) return false;
    p_ = grown;
    cap_ = want;
  }
  std::memcpy(p_ + size_, data, n);
  size_ += n;
  return true;
}

namespace {

// Where the write callback puts the body, and the most it may hold.
struct BodySink {
  void* body;  // Ec2Client::Body (private to the client)
  size_t limit;
  bool over = false;
};

}  // namespace

// Appends up to the limit; past it, returns 0 so libcurl stops the transfer at once
// (CURLE_WRITE_ERROR): nothing beyond the limit is ever held.
size_t Ec2Client::collect(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<BodySink*>(user);
  const size_t bytes = size * n;
  auto* body = static_cast<Body*>(sink->body);
  if (bytes > sink->limit - std::min(sink->limit, body->size())) {
    sink->over = true;
    return 0;
  }
  return body->append(data, bytes, sink->limit) ? bytes : 0;  // 0: out of memory, a transport error
}

bool retryable_code(const std::string& code) {
  static const char* const codes[] = {"RequestLimitExceeded", "Throttling", "ThrottlingException",
                                      "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
                                      "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
                                      "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
                                      "EC2ThrottledException"};
  for (const char* c : codes)
    if (code == c) return true;
  return false;
}

std::string explain(const std::string& action, const std::string& code, const std::string& message,
                    const ResolvedAws& aws) {
  std::string head = "aws " + action + " (" + aws.region + "): " + code + (message.empty() ? "" : ": " + message);
  std::string what;
  if (code == "UnauthorizedOperation" || code == "AccessDenied" || code == "AccessDeniedException") {
    what = "the credentials from " + aws.credentials.source + " may not call ec2:" + action +
           "; allow that IAM action in their policy";
  } else if (code == "AuthFailure" || code == "SignatureDoesNotMatch" || code == "InvalidClientTokenId" ||
             code == "IncompleteSignature") {
    what = "AWS rejected the credentials from " + aws.credentials.source +
           ": check the access key and secret, and that this machine's clock is right";
  } else if (code == "RequestExpired") {
    what = "the request's time is too far from AWS's: set this machine's clock right (NTP)";
  } else if (code == "ExpiredToken" || code == "ExpiredTokenException") {
    what = "the session token from " + aws.credentials.source + " has expired: get new credentials";
  } else if (code == "OptInRequired") {
    what = "the account is not subscribed to EC2 in " + aws.region + ": enable the region for the account";
  } else if (code == "VcpuLimitExceeded" || code == "InstanceLimitExceeded" || code == "MaxSpotInstanceCountExceeded") {
    what = "the account's vCPU quota for this instance family in " + aws.region +
           " is too small for the pool: request an increase (Service Quotas, \"Running On-Demand ... instances\" or "
           "\"All ... Spot Instance Requests\"), or ask for fewer nodes";
  } else if (code == "InsufficientInstanceCapacity" || code == "InsufficientCapacity" ||
             code == "SpotMaxPriceTooLow" || code == "InsufficientFreeAddressesInSubnet") {
    what = "AWS has no capacity for this request right now: list other subnets (availability zones) or instance "
           "types in [provider], or try again later";
  } else if (code.rfind("InvalidAMIID", 0) == 0) {
    what = "the image does not exist in " + aws.region + " (AMI ids are per region): check [provider] image";
  } else if (code.rfind("InvalidKeyPair", 0) == 0) {
    what = "check [provider] key_name, or leave it out to have a key pair made for the pool";
  } else if (code.rfind("InvalidSubnetID", 0) == 0 || code.rfind("InvalidGroup", 0) == 0) {
    what = "check [provider] subnet and security_group: they must exist in " + aws.region;
  } else if (code == "InvalidParameterValue" || code == "InvalidParameterCombination" || code == "MissingParameter") {
    what = "a parameter skyforge sent was refused: check the [provider] options named in the message";
  } else if (retryable_code(code)) {
    what = "AWS is throttling or failing; retried with backoff and gave up";
  }
  return what.empty() ? head : head + " -- " + what;
}

// application/x-www-form-urlencoded as botocore writes it (a space is '+'): AWS reads any correct
// encoding, but endpoints that check the signature against a body they re-encode (moto) need
// this one.
std::string form_encode(const QueryParams& params) {
  auto enc = [](const std::string& s) {
    std::string out;
    for (char c : s) out += c == ' ' ? std::string("+") : uri_encode(std::string_view(&c, 1), false);
    return out;
  };
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += '&';
    out += enc(k) + "=" + enc(v);
  }
  return out;
}

Ec2Client::Ec2Client(ResolvedAws aws, ClientOptions options)
    : aws_(std::move(aws)), options_(std::move(options)), url_(aws_.endpoint + "/"),
      host_header_(authority_of(aws_.endpoint)) {
  if (path_of(aws_.endpoint) != "/") url_ = aws_.endpoint;
  curl_global();
  curl_ = curl_easy_init();
  if (!curl_) throw std::runtime_error("aws: curl_easy_init failed");
}

Ec2Client::~Ec2Client() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

size_t Ec2Client::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

Ec2Client::Response Ec2Client::post(const std::string& body) {
  HttpRequest req;
  req.method = "POST";
  req.path = path_of(url_);
  req.headers = {{"Host", host_header_}, {"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}};
  req.body = body;
  SigningParams sp;
  sp.region = aws_.region;
  sp.service = options_.service;
  sp.when = std::chrono::system_clock::now();
  Signature sig = sign_headers(req, aws_.credentials, sp);

  std::lock_guard<std::mutex> lock(mu_);
  ++requests_;
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  curl_slist* headers = nullptr;
  for (const auto& [k, v] : req.headers) headers = curl_slist_append(headers, (k + ": " + v).c_str());
  for (const auto& [k, v] : sig.added_headers) headers = curl_slist_append(headers, (k + ": " + v).c_str());
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  Response r;
  BodySink sink{&r.body, options_.max_response_bytes};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, long(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  // A Content-Length over the limit is refused before any of the body is read.
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, curl_off_t(options_.max_response_bytes));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, long(options_.timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, long(options_.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM from the resolver: threads and the host's signals
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOPROXY, "");  // the usual *_proxy variables still apply
  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (sink.over || rc == CURLE_FILESIZE_EXCEEDED) {
    r.too_large = true;
    r.body.release();
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  } else if (rc != CURLE_OK) {
    r.transport_error = errbuf[0] ? errbuf : curl_easy_strerror(rc);
  } else {
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  }
  return r;
}

pugi::xml_document Ec2Client::call(const std::string& action, const QueryParams& params, int max_attempts) {
  const int attempts = max_attempts > 0 ? max_attempts : options_.max_attempts;
  QueryParams all = {{"Action", action}, {"Version", options_.api_version}};
  all.insert(all.end(), params.begin(), params.end());
  const std::string body = form_encode(all);
  const auto start = std::chrono::steady_clock::now();
  thread_local std::mt19937_64 rng{std::random_device{}()};

  for (int attempt = 1;; ++attempt) {
    Response r = post(body);
    if (r.too_large) {
      // Not a failure a retry cures: the same endpoint would send the same again.
      throw ApiError("aws " + action + " (" + aws_.region + "): the answer from " + aws_.endpoint + " (HTTP " +
                         std::to_string(r.status) + ") is longer than " + size_text(options_.max_response_bytes) +
                         ", the most the aws client reads; the transfer was stopped there -- check that the "
                         "endpoint (AWS_ENDPOINT_URL_EC2, AWS_ENDPOINT_URL, the profile's endpoint_url) is EC2's",
                     action, "ResponseTooLarge", "response body over " + size_text(options_.max_response_bytes),
                     r.status);
    }
    std::string code, message;
    pugi::xml_document doc;
    if (r.transport_error.empty()) {
      pugi::xml_parse_result parsed = doc.load_buffer(r.body.data(), r.body.size());
      if (r.status >= 200 && r.status < 300) {
        if (parsed) return doc;
        code = "MalformedResponse";
        message = std::string("the response is not XML (") + parsed.description() + ")";
      } else if (parsed) {
        // <Response><Errors><Error><Code/><Message/></Error></Errors>...</Response>, or a bare
        // <ErrorResponse><Error>... from some front ends.
        pugi::xpath_node err = doc.select_node("//Error");
        code = err.node().child_value("Code");
        message = err.node().child_value("Message");
      }
      if (code.empty()) code = "HTTP" + std::to_string(r.status);
    }
    const bool transient = r.transport_error.empty() ? (retryable_code(code) || retryable_transport(r.status, ""))
                                                     : true;
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (!transient || attempt >= attempts || elapsed >= options_.deadline) {
      if (!r.transport_error.empty()) {
        throw ApiError("aws " + action + " (" + aws_.region + "): no answer from " + aws_.endpoint + ": " +
                           r.transport_error + " (after " + std::to_string(attempt) + " attempt" +
                           (attempt == 1 ? "" : "s") + ")",
                       action, "", r.transport_error, 0);
      }
      std::string what = explain(action, code, message, aws_);
      if (attempt > 1) what += " (after " + std::to_string(attempt) + " attempts)";
      throw ApiError(what, action, code, message, r.status);
    }
    const double cap = std::min<double>(double(options_.backoff_cap.count()),
                                        double(options_.backoff_base.count()) * double(1ull << std::min(attempt, 20)));
    auto wait = std::chrono::milliseconds(int64_t(std::uniform_real_distribution<double>(0, cap)(rng)));
    if (options_.on_retry) {
      options_.on_retry("aws " + action + ": " + (r.transport_error.empty() ? code : r.transport_error) +
                        "; retry " + std::to_string(attempt) + "/" + std::to_string(attempts - 1) +
                        " in " + std::to_string(wait.count()) + " ms");
    }
    std::this_thread::sleep_for(wait);
  }
}

}  // namespace skyforge::aws
