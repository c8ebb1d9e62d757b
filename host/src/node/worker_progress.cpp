// What the host hears from a worker besides its results (worker_impl.hpp): the plugins' log and
// status lines, the Progress frames the collective watchdog reads, and the provider's lease
// file kept fresh while the worker holds the host's lease.
#include <fcntl.h>
#include <sys/stat.h>

#include <boost/asio/post.hpp>

#include <algorithm>

#include "worker_impl.hpp"

namespace skyforge {

void Worker::on_log(int32_t level, const std::string& m) {
  if (level == SF_LOG_STATUS) {  // what the app is doing: quoted by the host if this node is lost
    // Sent with the heartbeat's Progress, and at once when the last went out 100 ms ago or more,
    // else when those 100 ms are over, so that "last seen" is at most that old.
    const auto now = std::chrono::steady_clock::now();
    bool send = false, later = false;
    std::chrono::steady_clock::time_point due;
    {
      std::lock_guard<std::mutex> lock(status_mu_);
      status_ = m.substr(0, 256);
      if (now - status_sent_ >= kStatusEvery) {
        status_sent_ = now;
        send = true;
      } else if (!status_due_) {
        status_due_ = true;
        later = true;
        due = status_sent_ + kStatusEvery;
      }
    }
    if (send) boost::asio::post(io_, [this] { send_progress(); });
    if (later) boost::asio::post(io_, [this, due] { send_status_at(due); });
    return;
  }
  if (level < min_log_level_) return;
  send_log(3, std::string(level >= SF_LOG_ERROR ? "error: " : level >= SF_LOG_WARN ? "warning: " : "") + m + "\n");
}

void Worker::report_progress() {
  send_progress();
  if (finishing_) return;
  if (!progress_timer_) progress_timer_ = std::make_unique<boost::asio::steady_timer>(io_);
  progress_timer_->expires_after(std::chrono::milliseconds(std::max(50, args_.heartbeat_ms)));
  progress_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) report_progress();
  });
}

void Worker::send_status_at(std::chrono::steady_clock::time_point due) {
  if (!status_timer_) status_timer_ = std::make_unique<boost::asio::steady_timer>(io_);
  status_timer_->expires_at(due);
  status_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    {
      std::lock_guard<std::mutex> lock(status_mu_);
      status_due_ = false;
      status_sent_ = std::chrono::steady_clock::now();
    }
    send_progress();
  });
}

void Worker::send_progress() {
  std::shared_ptr<GlooCommunicator> comm;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm = comm_;
  }
  if (finishing_) return;
  msg::Progress m;
  if (comm) {
    const GlooCommunicator::Progress p = comm->progress();
    m.entered = p.entered;
    m.done = p.done;
    m.op = p.op;
    m.bytes = p.bytes;
    m.since_ms = p.since_ms;
  }
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    m.status = status_;
  }
  if (comm || !m.status.empty())
    if (auto c = conn_) c->send_msg(msg::Type::Progress, m);
}

void Worker::renew_lease_file() {
  ::utimensat(AT_FDCWD, lease_file_.c_str(), nullptr, 0);
  lease_timer_->expires_after(std::chrono::seconds(5));
  lease_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) renew_lease_file();
  });
}

}  // namespace skyforge
