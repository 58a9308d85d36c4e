package dnsproxy

import (
	"container/list"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// answerCache keeps upstream answers for their TTL, as ztunnel's resolver
// (hickory's, cache_size 4096) does, so that a name an app asks again and
// again costs one upstream exchange per TTL, not one per query, and a busy
// pod keeps answering its usual names through a short upstream outage.
//
// What is kept: NOERROR answers for the smallest TTL among their answer
// records, and negative answers (NXDOMAIN, or NOERROR without an answer of
// the asked type) for the SOA's negative TTL (RFC 2308: the smaller of the
// SOA record's TTL and its MINIMUM); never a truncated reply, SERVFAIL or
// anything else, nor an answer with no TTL to go by. TTLs are capped at a
// day. A hit is served with its TTLs reduced by the time it spent in the
// cache, with the client's id and the question as the client spelled it.
// Least recently used entries go first when the cache is full. A nil
// *answerCache caches nothing.
type answerCache struct {
	max int
	now func() time.Time

	mu      sync.Mutex // guards the following fields
	lru     *list.List // of *cacheEntry, most recently used first
	entries map[cacheKey]*list.Element
}

// cacheKey is a question, its name in lower case (DNS names compare
// without case).
type cacheKey struct {
	name          string
	qtype, qclass uint16
}

type cacheEntry struct {
	key     cacheKey
	msg     *dns.Msg // as upstream answered (id and question aside)
	stored  time.Time
	expires time.Time
}

// maxCacheTTL caps how long any answer is kept (hickory's MAX_TTL).
const maxCacheTTL = 24 * time.Hour

func newAnswerCache(max int, now func() time.Time) *answerCache {
	return &answerCache{max: max, now: now, lru: list.New(), entries: make(map[cacheKey]*list.Element)}
}

func keyOf(q dns.Question) cacheKey {
	return cacheKey{name: strings.ToLower(q.Name), qtype: q.Qtype, qclass: q.Qclass}
}

// get returns a copy of the cached answer to req, aged, or nil.
func (c *answerCache) get(req *dns.Msg) *dns.Msg {
	if c == nil || len(req.Question) != 1 {
		return nil
	}
	k := keyOf(req.Question[0])
	now := c.now()
	c.mu.Lock()
	el, ok := c.entries[k]
	if !ok {
		c.mu.Unlock()
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.expires) {
		c.lru.Remove(el)
		delete(c.entries, k)
		c.mu.Unlock()
		return nil
	}
	c.lru.MoveToFront(el)
	msg, stored := e.msg, e.stored
	c.mu.Unlock()

	out := msg.Copy()
	out.Id = req.Id
	out.Question = []dns.Question{req.Question[0]}
	age := uint32(now.Sub(stored) / time.Second)
	for _, rrs := range [][]dns.RR{out.Answer, out.Ns, out.Extra} {
		for _, rr := range rrs {
			h := rr.Header()
			if h.Rrtype == dns.TypeOPT {
				continue
			}
			h.Ttl -= min(h.Ttl, age)
		}
	}
	return out
}

// put keeps resp, the upstream's answer to req, if it may be cached.
func (c *answerCache) put(req, resp *dns.Msg) {
	if c == nil || len(req.Question) != 1 || resp.Truncated {
		return
	}
	ttl, ok := cacheTTL(req.Question[0], resp)
	if !ok {
		return
	}
	now := c.now()
	k := keyOf(req.Question[0])
	e := &cacheEntry{key: k, msg: resp.Copy(), stored: now, expires: now.Add(ttl)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		el.Value = e
		c.lru.MoveToFront(el)
		return
	}
	c.entries[k] = c.lru.PushFront(e)
	for c.lru.Len() > c.max {
		last := c.lru.Back()
		c.lru.Remove(last)
		delete(c.entries, last.Value.(*cacheEntry).key)
	}
}

// len is the number of entries, expired ones not yet seen included.
func (c *answerCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// cacheTTL is how long resp may be kept as the answer to q.
func cacheTTL(q dns.Question, resp *dns.Msg) (time.Duration, bool) {
	var ttl uint32
	found := false
	switch resp.Rcode {
	case dns.RcodeSuccess:
		for _, rr := range resp.Answer {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			if !found || rr.Header().Ttl < ttl {
				ttl = rr.Header().Ttl
			}
			found = true
		}
		if found {
			break
		}
		fallthrough // NOERROR without an answer: negative (NODATA)
	case dns.RcodeNameError:
		for _, rr := range resp.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl, found = min(soa.Hdr.Ttl, soa.Minttl), true
				break
			}
		}
	}
	if !found || ttl == 0 {
		return 0, false
	}
	return min(time.Duration(ttl)*time.Second, maxCacheTTL), true
}
