// Callbacks the host lends to plugins — sf_sink writers, sf_env, sf_image_editor, sf_node_sink,
// the services table — run inside a plugin's frames, so a C++ exception must never unwind
// through them (sdk/include/skyforge/abi.h). lent() runs a callback's body, catches anything it
// throws and keeps the first such failure on this thread; PluginInstance::check reports it as
// the hook's failure once the hook has returned.
#pragma once

#include <skyforge/abi.h>

#include <exception>
#include <string>
#include <utility>

namespace skyforge {

// Keeps `what` as this thread's lent-callback failure unless one is kept already.
void note_lent_failure(const char* what) noexcept;
// This thread's kept failure ("" for none), cleared.
std::string take_lent_failure();

// Runs f() for a lent callback; on an exception returns `fallback` (noted as above).
template <class R, class F>
R lent(R fallback, F&& f) noexcept {
  try {
    return std::forward<F>(f)();
  } catch (const std::exception& e) {
    note_lent_failure(e.what());
  } catch (...) {
    note_lent_failure("an unknown exception");
  }
  return fallback;
}

template <class F>
void lent(F&& f) noexcept {
  (void)lent<bool>(false, [&] {
    std::forward<F>(f)();
    return true;
  });
}

// A sink that appends what a plugin writes to `s` (which must outlive the hook call).
inline sf_sink text_sink(std::string& s) {
  return sf_sink{&s, [](void* c, const char* d, size_t n) { lent([&] { static_cast<std::string*>(c)->append(d, n); }); }};
}

}  // namespace skyforge
