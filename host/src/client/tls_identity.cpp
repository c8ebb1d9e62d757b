#include "tls_identity.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>

namespace skyforge {
namespace {

template <class T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Ext = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

void check_private_dir(const std::filesystem::path& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) fail(dir.string() + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) fail(dir.string() + " is not a directory (a symlink is not accepted)");
  if (st.st_uid != ::geteuid()) fail(dir.string() + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user");
  if (st.st_mode & 077) fail(dir.string() + " is open to other users (mode 0" + std::to_string((st.st_mode >> 6) & 7) +
                             std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) + "): 0700 expected");
}

std::string pem(const std::function<int(BIO*)>& write) {
  Bio b(BIO_new(BIO_s_mem()));
  if (!b || write(b.get()) != 1) fail("PEM encoding failed");
  char* data = nullptr;
  const long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

void write_private(const std::filesystem::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create " + path.string() + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(path.c_str());
      fail("cannot write " + path.string() + ": " + std::strerror(e));
    }
    off += static_cast<size_t>(w);
  }
  if (::close(fd) != 0) fail("cannot write " + path.string() + ": " + std::strerror(errno));
}

}  // namespace

void write_tls_identity(const std::filesystem::path& dir) {
  check_private_dir(dir);
  Pkey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) fail("P-256 key generation failed");
  Cert x(X509_new());
  unsigned char serial[16];
  if (!x || RAND_bytes(serial, sizeof serial) != 1) fail("certificate allocation failed");
  serial[0] &= 0x7f;  // a positive INTEGER
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  const bool serial_ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x.get())) != nullptr;
  BN_free(bn);
  X509_NAME* name = X509_get_subject_name(x.get());
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  const bool ok =
      serial_ok && X509_set_version(x.get(), 2) == 1 && X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600) &&
      X509_gmtime_adj(X509_getm_notAfter(x.get()), 400L * 24 * 3600) && X509_set_pubkey(x.get(), key.get()) == 1 &&
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("skyforge-pool"), -1,
                                 -1, 0) == 1 &&
      X509_set_issuer_name(x.get(), name) == 1 && [&] {
        Ext e(X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, "critical,CA:FALSE"));
        return e && X509_add_ext(x.get(), e.get(), -1) == 1;
      }() && X509_sign(x.get(), key.get(), EVP_sha256()) > 0;
  if (!ok) fail("making the self-signed certificate failed");
  const std::string key_pem = pem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  const std::string cert_pem = pem([&](BIO* b) { return PEM_write_bio_X509(b, x.get()); });
  write_private(dir / "key.pem", key_pem);
  try {
    write_private(dir / "cert.pem", cert_pem);
  } catch (...) {
    ::unlink((dir / "key.pem").c_str());  // no key is left without its certificate
    throw;
  }
}

}  // namespace skyforge
