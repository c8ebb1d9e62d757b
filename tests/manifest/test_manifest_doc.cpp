// docs/manifest.md's table of top-level tables against the parser: the doc names every table
// the parser accepts and no other, and each row links to a section of the page.
#include <gtest/gtest.h>

#include <cctype>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../support/read_text.hpp"
#include "problems.hpp"

namespace skyforge::test {
namespace {

// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as '-'.
std::string anchor(const std::string& heading) {
  std::string a;
  for (unsigned char c : heading)
    if (std::isalnum(c) || c == '-' || c == '_') a += char(std::tolower(c));
    else if (c == ' ') a += '-';
  return a;
}

// The tables the parser accepts, as its refusal of an unknown one lists them.
std::set<std::string> parser_tables() {
  const std::regex known(R"(unknown table \[no_such_table\] \(known: ([^)]*)\))");
  for (const std::string& p : problems_of("[no_such_table]\n")) {
    std::smatch m;
    if (!std::regex_search(p, m, known)) continue;
    std::set<std::string> names;
    std::istringstream in(m[1].str());
    for (std::string n; std::getline(in >> std::ws, n, ',');) names.insert(n);
    return names;
  }
  ADD_FAILURE() << "no 'unknown table' problem for [no_such_table]";
  return {};
}

TEST(ManifestDoc, TopLevelTableNamesEveryTableTheParserAcceptsAndLinksToItsSection) {
  std::istringstream doc(read_text(std::string(SKYFORGE_SOURCE_DIR) + "/docs/manifest.md"));
  const std::regex heading(R"(#+ (.*))"), row(R"(\| \[`\[{1,2}([a-z_]+)\]{1,2}`\]\(#([^)]*)\) \|.*)");
  std::set<std::string> headings, documented;
  std::vector<std::pair<std::string, std::string>> links;  // table -> anchor
  bool in_top = false, in_code = false;
  for (std::string line; std::getline(doc, line);) {
    std::smatch m;
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    if (in_code) continue;
    if (std::regex_match(line, m, heading)) {
      headings.insert(anchor(m[1]));
      in_top = line == "## Top level";
    } else if (in_top && std::regex_match(line, m, row)) {
      documented.insert(m[1]);
      links.emplace_back(m[1], m[2]);
    }
  }
  ASSERT_TRUE(headings.count("top-level")) << "docs/manifest.md has no \"## Top level\"";
  for (const auto& [table, to] : links) EXPECT_TRUE(headings.count(to)) << "[" << table << "] links to #" << to << ", no heading of the page";
  EXPECT_EQ(documented, parser_tables()) << "docs/manifest.md, \"Top level\", against manifest.cpp";
}

}  // namespace
}  // namespace skyforge::test
