// The bounded archive's and the payload streambufs' out-of-line parts (bounded_archive.hpp).
#include "bounded_archive.hpp"

#include <boost/archive/detail/archive_serializer_map.hpp>
#include <boost/archive/impl/archive_serializer_map.ipp>
#include <boost/archive/impl/basic_binary_iarchive.ipp>
#include <boost/archive/impl/basic_binary_iprimitive.ipp>
#include <boost/core/demangle.hpp>

// The bounded archive's out-of-line members come from Boost's own implementation files.
namespace boost::archive {
namespace detail {
template class archive_serializer_map<skyforge::net::detail::BoundedIArchive>;
}
template class basic_binary_iprimitive<skyforge::net::detail::BoundedIArchive, char, std::char_traits<char>>;
template class basic_binary_iarchive<skyforge::net::detail::BoundedIArchive>;
}  // namespace boost::archive

namespace skyforge::net::detail {

ViewBuf::ViewBuf(std::string_view v) {
  char* p = const_cast<char*>(v.data());  // never written through: this buffer has no put area
  setg(p, p, p + v.size());
}

StringSinkBuf::int_type StringSinkBuf::overflow(int_type c) {
  if (!traits_type::eq_int_type(c, traits_type::eof())) out_.push_back(traits_type::to_char_type(c));
  return traits_type::not_eof(c);
}

std::streamsize StringSinkBuf::xsputn(const char* s, std::streamsize n) {
  out_.append(s, static_cast<size_t>(n));
  return n;
}

BoundedIArchive::BoundedIArchive(ViewBuf& buf)
    : Base(static_cast<std::streambuf&>(buf), boost::archive::no_header | boost::archive::no_codecvt), buf_(buf) {
  init(boost::archive::no_header | boost::archive::no_codecvt);
}

void BoundedIArchive::load_override(boost::serialization::collection_size_type& t) {
  Base::load_override(t);
  // Every element takes at least one byte, so a count above what is left is a lie.
  if (static_cast<size_t>(t) > remaining())
    throw ProtocolError("a collection claims " + std::to_string(static_cast<size_t>(t)) + " elements but only " +
                        std::to_string(remaining()) + " bytes are left");
}

void BoundedIArchive::load_override(boost::archive::version_type& t) {
  Base::load_override(t);
  if (t != boost::archive::version_type(0))
    throw ProtocolError("class version " + std::to_string(static_cast<unsigned>(t)) + " (this protocol writes 0)");
}

void BoundedIArchive::load_override(boost::serialization::item_version_type& t) {
  Base::load_override(t);
  if (t != boost::serialization::item_version_type(0))
    throw ProtocolError("element version " + std::to_string(static_cast<unsigned>(t)) + " (this protocol writes 0)");
}

void BoundedIArchive::load_override(boost::archive::tracking_type& t) {
  // Written as one raw byte (a bool): read it as a byte, never into a bool.
  unsigned char c = 0;
  load_binary(&c, 1);
  if (c != 0) throw ProtocolError("object tracking flag " + std::to_string(c) + " (messages hold no pointers)");
  t = boost::archive::tracking_type(false);
}

void BoundedIArchive::load(std::string& s) {
  std::size_t n = 0;
  load_binary(&n, sizeof n);
  if (n > remaining())
    throw ProtocolError("a string claims " + std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
                        " are left");
  s.resize(n);
  if (n > 0) load_binary(s.data(), n);
}

void BoundedIArchive::load(bool& b) {
  unsigned char c = 0;
  load_binary(&c, 1);
  if (c > 1) throw ProtocolError("invalid bool value " + std::to_string(c));
  b = c != 0;
}

void throw_malformed(const char* type_name, const char* what) {
  std::string name = boost::core::demangle(type_name);
  if (auto p = name.rfind("::"); p != std::string::npos) name = name.substr(p + 2);
  throw ProtocolError("malformed " + name + " payload: " + what);
}

}  // namespace skyforge::net::detail
