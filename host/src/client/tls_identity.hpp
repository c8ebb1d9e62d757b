// A throwaway TLS identity for a listener that its peers pin: the Python pool's caller makes one
// per pool (`skyforge tls-identity DIR`, docs/python.md), serves TLS 1.3 with it, and hands the
// certificate to the nodes through the sealed control plane; they accept that certificate and no
// other. No CA, no host name: the pin is the trust.
#pragma once

#include <filesystem>
#include <string>

namespace skyforge {

// Writes DIR/key.pem (a fresh ECDSA P-256 key, PKCS#8 PEM) and DIR/cert.pem (a self-signed
// X.509 v3 certificate for it, CN skyforge-pool, valid from an hour ago for 400 days), both 0600,
// created exclusively (never over an existing file, never through a symlink). DIR must be a
// directory of this user's with no access for anyone else (0700 or stricter), not a symlink.
// Throws std::runtime_error naming the path and what is wrong.
void write_tls_identity(const std::filesystem::path& dir);

}  // namespace skyforge
