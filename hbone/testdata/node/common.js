'use strict';
// Helpers shared by the interop scripts: reading the certificates the Go
// test wrote, checking a peer's SPIFFE identity, and deterministic data.
// Plain Node (18 or later), no npm packages.

const fs = require('fs');
const path = require('path');

// tlsOptions reads key.pem, chain.pem and roots.pem from dir: TLS 1.3 only,
// as HBONE requires.
function tlsOptions(dir) {
  return {
    key: fs.readFileSync(path.join(dir, 'key.pem')),
    cert: fs.readFileSync(path.join(dir, 'chain.pem')),
    ca: fs.readFileSync(path.join(dir, 'roots.pem')),
    minVersion: 'TLSv1.3',
    maxVersion: 'TLSv1.3',
  };
}

// hasURI reports whether a peer certificate (tls getPeerCertificate) carries
// the URI SAN want. HBONE peers are named by SPIFFE URI, not host name.
function hasURI(cert, want) {
  if (!cert || typeof cert.subjectaltname !== 'string') return false;
  return cert.subjectaltname.split(', ').includes('URI:' + want);
}

// Data is a deterministic byte source (xorshift32), so that runs repeat.
class Data {
  constructor(seed) {
    this.x = (seed >>> 0) || 1;
  }
  next(n) {
    const b = Buffer.allocUnsafe(n);
    let x = this.x;
    for (let i = 0; i < n; i++) {
      x ^= x << 13; x >>>= 0;
      x ^= x >>> 17;
      x ^= x << 5; x >>>= 0;
      b[i] = x & 0xff;
    }
    this.x = x;
    return b;
  }
}

// fail prints the error and exits non-zero, so the Go test sees why.
function fail(msg) {
  process.stderr.write('node: ' + msg + '\n');
  process.exit(1);
}

module.exports = { tlsOptions, hasURI, Data, fail };
