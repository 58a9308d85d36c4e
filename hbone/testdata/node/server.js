'use strict';
// HBONE server on Node's http2: answers CONNECT over mTLS (client
// certificate required, in the test's trust) with 200 and echoes the stream;
// the peer's END_STREAM ends the echo with END_STREAM. CONNECT to
// deny.example:80 is answered 403, a client without the expected SPIFFE
// identity 401.
//
// Usage: node server.js <certdir> <client-spiffe-uri>
// Prints "listening <port>" once ready, then one JSON line per finished
// stream: {authority, forwarded, received, sha}. Exits when stdin closes.

const http2 = require('http2');
const crypto = require('crypto');
const { tlsOptions, hasURI, fail } = require('./common');

const [dir, clientID] = process.argv.slice(2);
if (!dir || !clientID) fail('usage: server.js <certdir> <client-spiffe-uri>');

const opts = tlsOptions(dir);
opts.requestCert = true;
opts.rejectUnauthorized = true;
opts.allowHTTP1 = false;

const server = http2.createSecureServer(opts);
server.on('stream', (stream, headers) => {
  stream.on('error', () => {});
  const authority = headers[':authority'];
  if (headers[':method'] !== 'CONNECT') {
    stream.respond({ ':status': 405 }, { endStream: true });
    return;
  }
  if (!hasURI(stream.session.socket.getPeerCertificate(), clientID)) {
    stream.respond({ ':status': 401 }, { endStream: true });
    return;
  }
  if (authority === 'deny.example:80') {
    stream.respond({ ':status': 403 }, { endStream: true });
    return;
  }
  stream.respond({
    ':status': 200,
    'x-authority': authority,
    'x-forwarded': headers['forwarded'] || '',
  });
  const hash = crypto.createHash('sha256');
  let received = 0;
  stream.on('data', (b) => {
    received += b.length;
    hash.update(b);
  });
  stream.on('end', () => {
    const line = { authority, forwarded: headers['forwarded'] || '', received, sha: hash.digest('hex') };
    process.stdout.write(JSON.stringify(line) + '\n');
  });
  // Echo with back-pressure; the peer's END_STREAM ends ours.
  stream.pipe(stream);
});
server.on('sessionError', () => {});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write('listening ' + server.address().port + '\n');
});
process.stdin.resume();
process.stdin.on('end', () => {
  server.close();
  process.exit(0);
});
