import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkNetwork, clientAddress, inCidr, looksLikeBrowser, parseIp, parseRange } from '../../src/policy/network.js';
import { cleanAttribution } from '../../src/proxy/context.js';

const within = (ip: string, cidr: string) => inCidr(parseIp(ip)!, parseRange(cidr)!);

test('CIDR matching, IPv4 and IPv6, mapped addresses the same client', () => {
  assert.ok(within('10.1.2.3', '10.0.0.0/8'));
  assert.ok(!within('11.0.0.1', '10.0.0.0/8'));
  assert.ok(within('::ffff:10.9.9.9', '10.0.0.0/8'), 'IPv4-mapped IPv6 is the IPv4 address');
  assert.ok(within('192.168.1.77', '192.168.1.64/26'));
  assert.ok(!within('192.168.1.128', '192.168.1.64/26'));
  assert.ok(within('2001:db8::1', '2001:db8::/32'));
  assert.ok(!within('2001:db9::1', '2001:db8::/32'));
  assert.ok(within('127.0.0.1', '127.0.0.1'), 'a bare address is a /32');
  assert.ok(within('1.2.3.4', '0.0.0.0/0'));
  assert.ok(!within('::1', '0.0.0.0/0'), 'an IPv4 /0 does not take in IPv6');
});

test('an IPv4-mapped range is the IPv4 range it stands for, and the client address is logged in IPv4 form', () => {
  // A dual-stack listener reports mapped peers; an operator copies what the access line shows.
  assert.ok(within('::ffff:127.0.0.1', '::ffff:127.0.0.1/128'));
  assert.ok(within('::ffff:127.0.0.1', '::ffff:127.0.0.1'));
  assert.ok(within('127.0.0.9', '::ffff:127.0.0.0/104'));
  assert.ok(!within('128.0.0.1', '::ffff:127.0.0.0/104'));
  assert.ok(within('::ffff:10.1.2.3', '::FFFF:10.0.0.0/104'));
  assert.ok(within('::2', '::/64'), 'other IPv6 ranges stay IPv6');
  assert.equal(clientAddress({ peer: '::ffff:127.0.0.1', forwardedFor: [], trusted: [] }), '127.0.0.1');
  const trusted = [parseRange('::ffff:127.0.0.0/104')!];
  assert.equal(clientAddress({ peer: '::ffff:127.0.0.1', forwardedFor: ['::ffff:203.0.113.9'], trusted }), '203.0.113.9', 'a mapped trusted range believes its proxy');
  assert.equal(clientAddress({ peer: '::1', forwardedFor: [], trusted: [] }), '::1');
});

test('malformed addresses and CIDRs are refused', () => {
  for (const bad of ['10.0.0.0/33', '10.0.0/8', '010.0.0.1', '1.2.3.4.5', '256.0.0.1', 'fe80::1::2', '2001:db8::/129', 'abc', '', '10.0.0.0/', '10.0.0.0/-1']) {
    assert.equal(parseRange(bad), null, bad);
  }
  assert.ok(parseRange('::/0'));
  assert.ok(parseRange('::ffff:1.2.3.4/128'));
});

test('client address: the peer, or the right-most untrusted X-Forwarded-For entry behind a trusted proxy', () => {
  const trusted = [parseRange('127.0.0.0/8')!, parseRange('10.99.0.0/16')!];
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: ['10.0.0.5'], trusted }), '10.0.0.5');
  // spoofed entries to the left of the proxy's own are ignored
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: ['10.0.0.5, 203.0.113.9'], trusted }), '203.0.113.9');
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: ['10.0.0.5', '203.0.113.9, 10.99.1.1'], trusted }), '203.0.113.9');
  // an untrusted peer's header is not believed
  assert.equal(clientAddress({ peer: '198.51.100.7', forwardedFor: ['10.0.0.5'], trusted }), '198.51.100.7');
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: [], trusted }), '127.0.0.1');
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: ['not-an-ip'], trusted }), null);
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: ['10.0.0.5'], trusted: [] }), '127.0.0.1');
});

test('checkNetwork: ips, then the browser rule', () => {
  const key = { ips: ['10.0.0.0/8'], allowBrowser: false };
  assert.equal(checkNetwork(key, { clientIp: '10.2.3.4', browser: false, refuseBrowsers: true }), null);
  assert.equal(checkNetwork(key, { clientIp: '127.0.0.1', browser: false, refuseBrowsers: true })?.code, 'ip_not_allowed');
  assert.equal(checkNetwork(key, { clientIp: null, browser: false, refuseBrowsers: true })?.code, 'ip_not_allowed', 'unknown address fails closed');
  assert.equal(checkNetwork({ ips: ['garbage'], allowBrowser: false }, { clientIp: '10.0.0.1', browser: false, refuseBrowsers: true })?.code, 'ip_not_allowed');
  assert.equal(checkNetwork({ ips: null, allowBrowser: false }, { clientIp: null, browser: true, refuseBrowsers: true })?.code, 'browser_request_refused');
  assert.equal(checkNetwork({ ips: null, allowBrowser: true }, { clientIp: null, browser: true, refuseBrowsers: true }), null);
  assert.equal(checkNetwork({ ips: null, allowBrowser: false }, { clientIp: null, browser: true, refuseBrowsers: false }), null);
});

test('checkNetwork: an empty ips list is set, and no address falls in it', () => {
  for (const clientIp of ['10.0.0.1', '2001:db8::1', '127.0.0.1', null]) {
    assert.equal(checkNetwork({ ips: [], allowBrowser: false }, { clientIp, browser: false, refuseBrowsers: true })?.code, 'ip_not_allowed', String(clientIp));
  }
});

test('browser detection: Origin or Sec-Fetch-*, but not the bare sec-fetch-mode of server-side fetch', () => {
  assert.ok(looksLikeBrowser(['Origin', 'https://x.example']));
  assert.ok(looksLikeBrowser(['Sec-Fetch-Mode', 'cors', 'Sec-Fetch-Site', 'cross-site']));
  assert.ok(looksLikeBrowser(['sec-fetch-mode', 'navigate']));
  assert.ok(!looksLikeBrowser(['sec-fetch-mode', 'cors', 'accept-language', '*']));
  assert.ok(!looksLikeBrowser(['Authorization', 'Bearer x']));
  // header names and values in any letter case
  assert.ok(!looksLikeBrowser(['Sec-Fetch-Mode', 'CORS']));
  assert.ok(!looksLikeBrowser(['SEC-FETCH-MODE', ' Cors ']));
  assert.ok(looksLikeBrowser(['Sec-Fetch-Mode', 'CORS', 'SEC-FETCH-DEST', 'empty']));
  assert.ok(looksLikeBrowser(['Sec-Fetch-Mode', 'NAVIGATE']));
});

test('cleanAttribution: C0, DEL and C1 control characters are removed, the rest trimmed and kept', () => {
  // Node reads header bytes 0x80-0x9f as U+0080-U+009F: NEL breaks lines, CSI starts terminal escapes.
  assert.equal(cleanAttribution(' my\u0085app\u009b31m\u0007 \t'), 'myapp31m');
  assert.equal(cleanAttribution('café'), 'café');
});

test('cleanAttribution: UTF-8 bytes are read as the text the client wrote', () => {
  // what Node's header string holds for UTF-8 bytes: one character per byte
  const asNodeReads = (text: string): string => Buffer.from(text, 'utf8').toString('latin1');
  assert.equal(cleanAttribution(asNodeReads('café €')), 'café €');
  // a C1 control written in UTF-8 is removed like the byte form
  assert.equal(cleanAttribution(asNodeReads('my\u0085app')), 'myapp');
  // bytes that are not UTF-8 keep their Latin-1 reading
  assert.equal(cleanAttribution('caf\u00e9 \u00ff'), 'café ÿ');
  // 256 characters at most, never half a surrogate pair
  const cut = cleanAttribution(asNodeReads('a' + '😀'.repeat(200)))!;
  assert.equal(cut.length, 255);
  assert.ok(cut.endsWith('😀'));
});
