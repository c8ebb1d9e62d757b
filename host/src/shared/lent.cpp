#include "lent.hpp"

namespace skyforge {
namespace {
thread_local std::string t_failure;
thread_local bool t_failed = false;
}  // namespace

void note_lent_failure(const char* what) noexcept {
  if (t_failed) return;
  t_failed = true;
  try {
    t_failure = what ? what : "";
  } catch (...) {
    t_failure.clear();  // out of memory: the flag still says a callback failed
  }
}

std::string take_lent_failure() {
  if (!t_failed) return {};
  t_failed = false;
  std::string out = t_failure.empty() ? std::string("a host callback failed") : std::move(t_failure);
  t_failure.clear();
  return out;
}

}  // namespace skyforge
