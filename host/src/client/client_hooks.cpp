// The framework plugins' hooks on the client (client_hooks.hpp).
#include "client_hooks.hpp"

#include "lent.hpp"

namespace skyforge {

void ClientHooks::enter(const sf_cluster& cluster, Image& image, std::vector<std::string>& bootstrap_lines) {
  sf_image_editor ed{};
  ed.ctx = &image;
  ed.add_apt = [](void* c, const char* p) { lent([&] { static_cast<Image*>(c)->apt.emplace_back(p ? p : ""); }); };
  ed.add_pip = [](void* c, const char* p) { lent([&] { static_cast<Image*>(c)->pip.emplace_back(p ? p : ""); }); };
  ed.set_env = [](void* c, const char* k, const char* v) {
    lent([&] { static_cast<Image*>(c)->env[k ? k : ""] = v ? v : ""; });
  };
  ed.add_file = [](void* c, const char* s, const char* d) {
    lent([&] { static_cast<Image*>(c)->files.push_back(FileCopy{s ? s : "", d ? d : "", SourcePos{}}); });
  };
  for (auto& fw : plugins_)
    if (fw->plugin().kind == SF_KIND_FRAMEWORK)
      fw->call_optional(&sf_framework_hooks::transform_image, "transform_image", &cluster, &ed);
  const sf_sink lines{&bootstrap_lines, [](void* c, const char* d, size_t n) {
                        lent([&] { static_cast<std::vector<std::string>*>(c)->emplace_back(d, n); });
                      }};
  for (auto& fw : plugins_)
    if (fw->plugin().kind == SF_KIND_FRAMEWORK)
      fw->call_optional(&sf_framework_hooks::bootstrap, "bootstrap", &cluster, lines);
  for (auto& fw : plugins_) {
    ++entered_;
    if (fw->plugin().kind == SF_KIND_FRAMEWORK)
      fw->call_optional(&sf_framework_hooks::around_client_enter, "around_client_enter", &cluster);
  }
}

void ClientHooks::exit(const sf_cluster& cluster, bool ok, const std::function<void(const std::string&)>& error) {
  while (entered_ > 0) {
    auto& fw = plugins_[--entered_];
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) continue;
    try {
      fw->call_optional(&sf_framework_hooks::around_client_exit, "around_client_exit", &cluster, ok ? SF_OK : SF_ERR);
    } catch (const std::exception& e) {
      error(e.what());
    }
  }
}

}  // namespace skyforge
