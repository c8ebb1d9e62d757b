// Control-plane wire protocol (docs/architecture.md, "The control plane"): the one include for
// its users. Each part is a header of its own:
//   framing.hpp          frames: the header, its encoding, the incremental decoder, ProtocolError
//   bounded_archive.hpp  payloads: serialize() and deserialize(), with every length bounded
//   crypto.hpp           HMAC-SHA256 and the CSPRNG
//   handshake.hpp        the handshake's three frames (secure_channel.hpp: its cryptography and
//                        the sealed records every frame after it travels in)
//   connection.hpp       the heartbeated, leased connection
//   server.hpp           the listening end: accept, the server's side of the handshake
//   connect.hpp          the connecting end: the client's side of the handshake, blocking
#pragma once

#include "bounded_archive.hpp"
#include "connect.hpp"
#include "connection.hpp"
#include "crypto.hpp"
#include "framing.hpp"
#include "messages.hpp"
#include "secure_channel.hpp"
#include "server.hpp"
