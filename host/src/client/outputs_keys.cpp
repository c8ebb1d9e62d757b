// [job] outputs, outputs_dir, outputs_max_bytes (outputs_keys.hpp).
#include "outputs_keys.hpp"

#include <cctype>
#include <charconv>
#include <cmath>

#include "messages.hpp"

namespace skyforge {
using namespace toml_in;

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  double number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end == text.data() || !std::isfinite(number) || number < 0) return std::nullopt;
  std::string_view unit = text.substr(size_t(end - text.data()));
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1},      {"B", 1},          {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},       {"TB", 1e12},
      {"KiB", 1024}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = std::round(number * scale);
    if (bytes > 1.8e19) return std::nullopt;
    if (name.empty() && bytes != number) return std::nullopt;  // a bare number is a whole count of bytes
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

void read_outputs(toml_in::Reader& r, const toml_in::Value& t, const std::string& dir, JobSpec& job) {
  auto relative_glob = [](const std::string& s, size_t) -> std::string {
    if (const char* problem = msg::output_name_problem(s))
      return quote(s) + " " + problem + ": expected a glob relative to the app's working directory (\"*.csv\", "
             "\"results/**\")";
    return "";
  };
  if (auto globs = r.string_array(t, "outputs", "[job]", false, relative_glob)) job.outputs = std::move(*globs);
  if (auto d = r.string(t, "outputs_dir", "[job]", true)) job.outputs_dir = detail::normalise_path(*d, dir);
  if (const Value* v = Reader::find(t, "outputs_max_bytes")) {
    std::optional<uint64_t> bytes;
    if (v->is_integer()) {
      const std::optional<int64_t> i = checked_integer(*v);
      if (i && *i >= 0) bytes = uint64_t(*i);
    } else if (v->is_string()) {
      bytes = parse_byte_size(v->as_string().str);
    }
    if (bytes) job.outputs_max_bytes = *bytes;
    else r.expected(*v, "[job] outputs_max_bytes", "a size in bytes: an integer >= 0 or a string like \"500 MiB\"");
  }
}

}  // namespace skyforge
