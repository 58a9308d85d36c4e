'use strict';
// HBONE client on Node's http2: CONNECT streams over mTLS to a server, each
// sending data full-duplex while reading the echo, then half-closing
// (END_STREAM) and reading the rest of the echo until the server ends too.
//
// Usage: node client.js <certdir> <host:port> <server-spiffe-uri> <spec>...
// where a spec is authority=bytes, e.g. 10.0.0.1:80=4194304. One JSON line
// per stream is printed: {authority, status, sent, received, sentSha, recvSha}.

const http2 = require('http2');
const crypto = require('crypto');
const { tlsOptions, hasURI, Data, fail } = require('./common');

const [dir, target, serverID, ...specs] = process.argv.slice(2);
if (!dir || !target || !serverID || specs.length === 0) {
  fail('usage: client.js <certdir> <host:port> <server-spiffe-uri> <authority=bytes>...');
}

const opts = tlsOptions(dir);
// No SNI and no host name check: the server must carry the expected SPIFFE
// URI, as ztunnel checks it.
opts.checkServerIdentity = (host, cert) =>
  hasURI(cert, serverID) ? undefined : new Error('server lacks URI SAN ' + serverID);

const session = http2.connect('https://' + target, opts);
session.on('error', (err) => fail('session: ' + err.message));

const chunk = 48 << 10;

function run(spec, seed) {
  return new Promise((resolve, reject) => {
    const eq = spec.lastIndexOf('=');
    const authority = spec.slice(0, eq);
    const total = Number(spec.slice(eq + 1));
    const res = { authority, status: 0, sent: 0, received: 0, sentSha: '', recvSha: '' };
    const sentHash = crypto.createHash('sha256');
    const recvHash = crypto.createHash('sha256');
    const data = new Data(seed);

    const req = session.request({
      ':method': 'CONNECT',
      ':authority': authority,
      'forwarded': 'for="127.0.0.1"',
      'baggage': 'k8s.namespace.name=interop',
    }, { endStream: false });
    req.on('error', reject);
    req.on('response', (headers) => {
      res.status = headers[':status'];
      if (res.status !== 200) {
        req.close(http2.constants.NGHTTP2_CANCEL);
        resolve(res);
        return;
      }
      pump();
    });
    // Full duplex: the echo is read while we still write.
    req.on('data', (b) => {
      res.received += b.length;
      recvHash.update(b);
    });
    req.on('end', () => {
      res.sentSha = sentHash.digest('hex');
      res.recvSha = recvHash.digest('hex');
      resolve(res);
    });

    function pump() {
      while (res.sent < total) {
        const b = data.next(Math.min(chunk, total - res.sent));
        sentHash.update(b);
        res.sent += b.length;
        if (!req.write(b)) {
          req.once('drain', pump);
          return;
        }
      }
      req.end(); // END_STREAM: half-close, the echo keeps coming
    }
  });
}

Promise.all(specs.map((s, i) => run(s, i + 1)))
  .then((results) => {
    for (const r of results) process.stdout.write(JSON.stringify(r) + '\n');
    session.close();
  })
  .catch((err) => fail('stream: ' + err.message));
