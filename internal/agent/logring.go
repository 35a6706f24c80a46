package agent

import (
	"bytes"
	"time"
)

// maxLogChunks bounds how many pieces the log ring holds (both streams
// together), so that a command writing a byte at a time cannot make the
// per-piece overhead outgrow the byte bound.
var maxLogChunks = 16 << 10

// logCoalesce is how long after a piece's first byte more output of the
// same stream is still appended to it (pieces carry the time of their first
// byte, which Logs' since filters on).
const logCoalesce = 100 * time.Millisecond

// logChunk is one piece of the entrypoint's output.
type logChunk struct {
	stderr bool
	at     time.Time
	off    uint64 // offset of data[0] in its stream's output since the start
	data   []byte
}

// logRing is the entrypoint's output: the newest limit bytes of each stream
// (and at most maxLogChunks pieces), in the order they came. Unlike outBuf
// it is read without being consumed, by any number of readers each holding
// a cursor (logCursor); what a reader had not read when it was dropped is
// counted for it. Not safe for concurrent use (entryProc guards it).
type logRing struct {
	chunks  []logChunk
	size    [2]int    // bytes held per stream
	written [2]uint64 // bytes ever added per stream
	limit   int
	// maxChunks, if not 0, bounds the pieces instead of maxLogChunks.
	maxChunks int
}

// setLimit lowers (or raises) the ring's bounds: limit bytes a stream and
// maxChunks pieces, dropping what is now beyond them.
func (r *logRing) setLimit(limit, maxChunks int) {
	r.limit, r.maxChunks = limit, maxChunks
	r.trim(0)
	r.trim(1)
}

// add appends data (which the ring now owns) read at time at, then drops
// the oldest bytes of the stream beyond the limit and the oldest pieces
// beyond maxLogChunks.
func (r *logRing) add(stderr bool, data []byte, at time.Time) {
	if len(data) == 0 {
		return
	}
	i := streamIndex(stderr)
	if n := len(r.chunks); n > 0 {
		c := &r.chunks[n-1]
		// A piece grows up to coalesceLimit, or the ring's limit if less
		// (appending may leave it twice that in capacity).
		if c.stderr == stderr && len(c.data) < min(coalesceLimit, r.limit) && at.Sub(c.at) < logCoalesce {
			c.data = append(c.data, data...)
			r.size[i] += len(data)
			r.written[i] += uint64(len(data))
			r.trim(i)
			return
		}
	}
	r.chunks = append(r.chunks, logChunk{stderr: stderr, at: at, off: r.written[i], data: data})
	r.size[i] += len(data)
	r.written[i] += uint64(len(data))
	r.trim(i)
}

// trim drops stream i's oldest bytes beyond the limit, then the oldest
// pieces beyond maxLogChunks.
func (r *logRing) trim(i int) {
	for j := 0; r.size[i] > r.limit && j < len(r.chunks); {
		c := &r.chunks[j]
		if streamIndex(c.stderr) != i {
			j++
			continue
		}
		over := r.size[i] - r.limit
		if over >= len(c.data) {
			r.size[i] -= len(c.data)
			if j == 0 {
				r.chunks = r.chunks[1:] // the common case: no copying
			} else {
				r.chunks = append(r.chunks[:j], r.chunks[j+1:]...)
			}
			continue
		}
		// Copy the rest so the dropped bytes' memory is freed.
		c.data = append([]byte(nil), c.data[over:]...)
		c.off += uint64(over)
		r.size[i] -= over
	}
	maxChunks := maxLogChunks
	if r.maxChunks > 0 {
		maxChunks = r.maxChunks
	}
	for len(r.chunks) > maxChunks {
		c := r.chunks[0]
		r.size[streamIndex(c.stderr)] -= len(c.data)
		r.chunks = r.chunks[1:]
	}
	if cap(r.chunks) > 4*len(r.chunks)+64 {
		r.chunks = append([]logChunk(nil), r.chunks...)
	}
}

// logCursor is one reader's position in a logRing: per stream, the offset
// up to which it has read output or skipped it on purpose. Pieces are
// appended to while they are young (logCoalesce), so a position inside the
// newest piece is normal.
type logCursor [2]uint64

// cursor returns a cursor at the start of what the ring holds, skipping
// pieces before since (if not zero) and all but the last tail lines (if
// tail >= 0). Bytes skipped that way are not counted as dropped, nor are
// those the ring dropped before (see dropped).
func (r *logRing) cursor(since time.Time, tail int64) logCursor {
	start := 0
	if !since.IsZero() {
		for start < len(r.chunks) && r.chunks[start].at.Before(since) {
			start++
		}
	}
	var partial []byte // the first piece's data, when tail cuts it
	if tail >= 0 {
		start, partial = r.tailStart(start, tail)
	}
	// Each stream's position is where its first selected byte is, or its
	// end if nothing of it is selected.
	cur := logCursor(r.written)
	for j := len(r.chunks) - 1; j >= start; j-- {
		c := r.chunks[j]
		cur[streamIndex(c.stderr)] = c.off
	}
	if partial != nil {
		c := r.chunks[start]
		cur[streamIndex(c.stderr)] = c.off + uint64(len(c.data)-len(partial))
	}
	return cur
}

// dropped is the number of bytes of each stream the ring no longer holds.
func (r *logRing) dropped() [2]uint64 {
	return [2]uint64{r.written[0] - uint64(r.size[0]), r.written[1] - uint64(r.size[1])}
}

// unread reports whether output was added after cur.
func (r *logRing) unread(cur logCursor) bool {
	return r.written[0] > cur[0] || r.written[1] > cur[1]
}

// tailStart finds where the last tail lines of the pieces from index start
// on begin: the index of the first piece and, if only the end of that piece
// is included, that end (nil otherwise). A last line without a newline
// counts as a line.
func (r *logRing) tailStart(start int, tail int64) (int, []byte) {
	if tail == 0 {
		return len(r.chunks), nil
	}
	lines := int64(0)
	last := true // at the very end: a trailing newline ends the last line, it does not start one
	for j := len(r.chunks) - 1; j >= start; j-- {
		d := r.chunks[j].data
		for k := len(d) - 1; k >= 0; k-- {
			if d[k] != '\n' {
				last = false
				continue
			}
			if last {
				last = false
				continue
			}
			lines++
			if lines == tail {
				if k == len(d)-1 {
					return j + 1, nil
				}
				return j, d[k+1:]
			}
		}
	}
	return start, nil
}

// read returns what cur has not read (copies, in order) and the bytes of
// each stream cur missed because the ring dropped them, and moves cur to
// the end.
func (r *logRing) read(cur *logCursor) (chunks []logChunk, dropped [2]uint64) {
	for _, c := range r.chunks {
		i := streamIndex(c.stderr)
		end := c.off + uint64(len(c.data))
		if end <= cur[i] {
			continue
		}
		data := c.data
		if c.off > cur[i] {
			dropped[i] += c.off - cur[i]
		} else {
			data = data[cur[i]-c.off:]
		}
		chunks = append(chunks, logChunk{stderr: c.stderr, at: c.at, off: end - uint64(len(data)), data: bytes.Clone(data)})
		cur[i] = end
	}
	// A stream whose held bytes were all read, or none of which is held
	// any more, may have lost bytes after the reader's position.
	for i, d := range r.dropped() {
		if d > cur[i] {
			dropped[i] += d - cur[i]
			cur[i] = d
		}
	}
	return chunks, dropped
}
