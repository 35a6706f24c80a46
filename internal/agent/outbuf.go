package agent

// defaultOutputLimit is how much output of each stream (stdout, stderr) of
// a detached process or the entrypoint is kept while no client takes it
// (Server.outputLimit; tests set Config.outputLimit).
const defaultOutputLimit = 1 << 20

// coalesceLimit is the size up to which consecutive output of one stream
// is merged into one chunk.
const coalesceLimit = 32 << 10

// outChunk is one piece of a process's output.
type outChunk struct {
	stderr bool
	data   []byte
}

// outBuf is a detached process's output not yet sent to a client, in the
// order it came, bounded per stream: when a stream holds more than its
// limit, its oldest bytes are dropped and counted. Not safe for concurrent
// use (detachedProc guards it).
type outBuf struct {
	chunks []outChunk
	// size and dropped are per stream: 0 stdout, 1 stderr.
	size    [2]int
	dropped [2]uint64
}

func streamIndex(stderr bool) int {
	if stderr {
		return 1
	}
	return 0
}

// add appends data (which the buffer now owns) and drops the stream's
// oldest bytes beyond limit.
func (b *outBuf) add(stderr bool, data []byte, limit int) {
	if len(data) == 0 {
		return
	}
	i := streamIndex(stderr)
	if n := len(b.chunks); n > 0 && b.chunks[n-1].stderr == stderr && len(b.chunks[n-1].data) < coalesceLimit {
		// Coalesce small writes so the chunk count stays low.
		b.chunks[n-1].data = append(b.chunks[n-1].data, data...)
	} else {
		b.chunks = append(b.chunks, outChunk{stderr: stderr, data: data})
	}
	b.size[i] += len(data)
	for j := 0; b.size[i] > limit && j < len(b.chunks); {
		c := &b.chunks[j]
		if c.stderr != stderr {
			j++
			continue
		}
		over := b.size[i] - limit
		if over >= len(c.data) {
			b.size[i] -= len(c.data)
			b.dropped[i] += uint64(len(c.data))
			b.chunks = append(b.chunks[:j], b.chunks[j+1:]...)
			continue
		}
		// Copy the rest so the dropped bytes' memory is freed.
		c.data = append([]byte(nil), c.data[over:]...)
		b.size[i] -= over
		b.dropped[i] += uint64(over)
	}
}

// take returns and removes everything buffered.
func (b *outBuf) take() []outChunk {
	c := b.chunks
	b.chunks, b.size = nil, [2]int{}
	return c
}

// takeDropped returns and resets the dropped byte counts.
func (b *outBuf) takeDropped() (stdout, stderr uint64) {
	stdout, stderr = b.dropped[0], b.dropped[1]
	b.dropped = [2]uint64{}
	return stdout, stderr
}

// buffered is the number of bytes buffered on both streams.
func (b *outBuf) buffered() int { return b.size[0] + b.size[1] }

// full reports whether the stream holds its limit or more.
func (b *outBuf) full(stderr bool, limit int) bool { return b.size[streamIndex(stderr)] >= limit }
