// A message's payload (docs/architecture.md, "The control plane"): serialize() writes the struct
// messages.hpp names for a frame's type as a Boost.Serialization binary archive (no header);
// deserialize() reads it back through BoundedIArchive, which checks every length against the
// bytes that are left, so that no payload makes the reader allocate more than a small multiple
// of its own size. Binary archives are not endian-portable: host and workers share an
// architecture.
#pragma once

#include <boost/archive/binary_iarchive_impl.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/array_optimization.hpp>
#include <boost/serialization/collection_size_type.hpp>
#include <boost/serialization/item_version_type.hpp>

#include <new>
#include <streambuf>
#include <string>
#include <string_view>
#include <typeinfo>

#include "framing.hpp"

namespace skyforge::net {

namespace detail {
// A read-only streambuf over caller-owned bytes.
class ViewBuf : public std::streambuf {
 public:
  explicit ViewBuf(std::string_view v);
  size_t remaining() const { return static_cast<size_t>(egptr() - gptr()); }
};

// A write-only streambuf appending to a std::string.
class StringSinkBuf : public std::streambuf {
 public:
  explicit StringSinkBuf(std::string& out) : out_(out) {}

 protected:
  int_type overflow(int_type c) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;

 private:
  std::string& out_;
};

// boost::archive::binary_iarchive with every length prefix checked against the bytes that are
// left, so a forged length cannot make the reader allocate more than a small multiple of the
// payload it actually received (worst case: sizeof(element) * payload size, and the payload is
// itself bounded by the frame limit). Also rejects bools other than 0/1, and class information
// the writer never produces (a class or element version other than 0, object tracking: messages hold no
// pointers), so that whatever it accepts serialises back to the same bytes.
class BoundedIArchive
    : public boost::archive::binary_iarchive_impl<BoundedIArchive, char, std::char_traits<char>> {
  using Base = boost::archive::binary_iarchive_impl<BoundedIArchive, char, std::char_traits<char>>;
  friend class boost::archive::detail::interface_iarchive<BoundedIArchive>;
  friend class boost::archive::basic_binary_iarchive<BoundedIArchive>;
  friend class boost::archive::load_access;

 public:
  explicit BoundedIArchive(ViewBuf& buf);
  size_t remaining() const { return buf_.remaining(); }

 public:  // Boost's primitive loaders reach these through the most derived type
  using Base::load;
  void load(std::string& s);
  void load(bool& b);

 protected:
  template <class T>
  void load_override(T& t) {
    Base::load_override(t);
  }
  void load_override(boost::serialization::collection_size_type& t);
  void load_override(boost::archive::version_type& t);
  void load_override(boost::serialization::item_version_type& t);
  void load_override(boost::archive::tracking_type& t);

 private:
  ViewBuf& buf_;
};

[[noreturn]] void throw_malformed(const char* type_name, const char* what);
}  // namespace detail
}  // namespace skyforge::net

// The writer (binary_oarchive) writes a vector of arithmetic values as one block; the reader
// must read it the same way (the trait is per archive type). The block's count is checked
// against the bytes left like every other length.
BOOST_SERIALIZATION_USE_ARRAY_OPTIMIZATION(skyforge::net::detail::BoundedIArchive)

namespace skyforge::net {

template <class T>
std::string serialize(const T& value) {
  std::string out;
  {
    detail::StringSinkBuf sink(out);
    boost::archive::binary_oarchive ar(sink, boost::archive::no_header | boost::archive::no_codecvt);
    ar << value;
  }
  return out;
}

// Throws ProtocolError ("malformed <type> payload: ...") on truncated, oversized, trailing or
// otherwise invalid input; never allocates more than a small multiple of payload.size().
template <class T>
T deserialize(std::string_view payload) {
  T value{};
  try {
    detail::ViewBuf buf(payload);
    detail::BoundedIArchive ar(buf);
    ar >> value;
    if (ar.remaining() != 0)
      throw ProtocolError(std::to_string(ar.remaining()) + " trailing bytes after the message");
  } catch (const ProtocolError& e) {
    detail::throw_malformed(typeid(T).name(), e.what());
  } catch (const std::bad_alloc&) {
    detail::throw_malformed(typeid(T).name(), "a length prefix is too large");
  } catch (const std::exception& e) {  // boost::archive::archive_exception, std::length_error, ...
    detail::throw_malformed(typeid(T).name(), e.what());
  }
  return value;
}

}  // namespace skyforge::net
