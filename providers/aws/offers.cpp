#include "offers.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace skyforge::aws {
namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::vector<Offer> load_offers(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("aws offers: cannot read " + path);
  const std::string header = "instance_type,accelerator,accelerator_count,vcpus,memory_gib,price,spot_price,region";
  std::vector<Offer> out;
  std::string line;
  bool seen_header = false;
  for (int no = 1; std::getline(in, line); ++no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    auto where = [&] { return path + " line " + std::to_string(no) + ": "; };
    if (!seen_header) {
      if (line != header) throw std::runtime_error(where() + "expected the header \"" + header + "\"");
      seen_header = true;
      continue;
    }
    auto f = split(line);
    if (f.size() != 8) throw std::runtime_error(where() + "expected 8 comma-separated fields, got " + std::to_string(f.size()));
    auto number = [&](const std::string& s, const char* what) -> std::optional<double> {
      if (s.empty()) return std::nullopt;
      try {
        size_t used = 0;
        double v = std::stod(s, &used);
        if (used == s.size() && v >= 0) return v;
      } catch (const std::exception&) {
      }
      throw std::runtime_error(where() + what + ": expected a non-negative number, got \"" + s + "\"");
    };
    Offer o;
    o.instance_type = f[0];
    o.accelerator = f[1];
    auto count = number(f[2], "accelerator_count");
    o.accelerator_count = count ? unsigned(*count) : 0;
    o.vcpus = number(f[3], "vcpus").value_or(0);
    o.memory_gib = number(f[4], "memory_gib").value_or(0);
    o.price = number(f[5], "price");
    o.spot_price = number(f[6], "spot_price");
    o.region = f[7];
    if (o.instance_type.empty() || o.accelerator.empty() || o.region.empty())
      throw std::runtime_error(where() + "instance_type, accelerator and region must not be empty");
    out.push_back(std::move(o));
  }
  if (!seen_header) throw std::runtime_error("aws offers: " + path + " has no header line \"" + header + "\"");
  return out;
}

std::string default_offers_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&default_offers_path), &info) == 0 || !info.dli_fname) return "offers.csv";
  return (std::filesystem::path(info.dli_fname).parent_path() / "offers.csv").string();
}

std::vector<Offer> offers_for(const std::vector<Offer>& all, const std::string& name, unsigned count,
                              const std::string& region, bool spot) {
  std::vector<Offer> out;
  for (const auto& o : all) {
    if (!name.empty() && (lower(o.accelerator) != lower(name) || o.accelerator_count != count)) continue;
    if (!region.empty() && o.region != region) continue;
    if (!(spot ? o.spot_price : o.price)) continue;
    out.push_back(o);
  }
  std::stable_sort(out.begin(), out.end(), [&](const Offer& a, const Offer& b) {
    return *(spot ? a.spot_price : a.price) < *(spot ? b.spot_price : b.price);
  });
  return out;
}

std::string format_offers(const std::vector<Offer>& offers) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-16s %-12s %5s %6s %9s %10s %10s  %s\n", "INSTANCE_TYPE", "ACCELERATOR", "COUNT",
                "VCPUS", "MEM_GIB", "USD/H", "SPOT_USD/H", "REGION");
  out += buf;
  auto price = [](const std::optional<double>& p) {
    char b[32];
    if (!p) return std::string("-");
    std::snprintf(b, sizeof b, "%.4f", *p);
    return std::string(b);
  };
  for (const auto& o : offers) {
    std::snprintf(buf, sizeof buf, "%-16s %-12s %5u %6.0f %9.0f %10s %10s  %s\n", o.instance_type.c_str(),
                  o.accelerator.c_str(), o.accelerator_count, o.vcpus, o.memory_gib, price(o.price).c_str(),
                  price(o.spot_price).c_str(), o.region.c_str());
    out += buf;
  }
  return out;
}

}  // namespace skyforge::aws
