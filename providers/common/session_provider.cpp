// The parts of SessionProvider that do not depend on the provider's node type.
#include "session_provider.hpp"

#include <stdexcept>

namespace skyforge::providers {

void start_session_worker(NodeSession& session, const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env, const std::string& who,
                          const std::string& where) {
  try {
    session.start_worker(argv, env);
  } catch (const std::invalid_argument& e) {
    throw Error(who + ": " + e.what(), SF_ERR_INVALID);
  } catch (const SessionGone& e) {
    throw Error(where + ": " + e.what(), SF_ERR_GONE);
  } catch (const std::runtime_error& e) {
    throw Error(where + ": " + e.what());
  }
}

int session_worker_exit(NodeSession& session, Provider::WorkerExit& out) {
  auto code = session.exit_status();
  if (!code) return 0;
  // The agent's `exit $rc`: a worker that signal N ended is 128+N (ssh's own failure, 255, is not one).
  if (*code > 128 && *code < 128 + 65) {
    out.exit_code = -1;
    out.signal = *code - 128;
  } else {
    out.exit_code = *code;
    out.signal = 0;
  }
  out.last_words = session.last_words();
  return 1;
}

}  // namespace skyforge::providers
