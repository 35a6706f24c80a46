package ocibox

import (
	"archive/tar"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Go's archive/tar reads sparse entries but cannot write them (its Writer
// drops GNU.sparse.* records), so a sparse file would reach the tar stream
// as its whole apparent size of zeros: 2 GiB of stream, hashing and
// gzipping for a 2 GiB file of holes in a 64 MiB box. Diff writes such
// files as PAX GNU sparse 1.0 entries instead (what GNU tar writes with
// --sparse --sparse-version=1.0, and what archive/tar, GNU tar and bsdtar
// read):
//
//	'x' header: GNU.sparse.major=1, GNU.sparse.minor=0,
//	            GNU.sparse.name=<name>, GNU.sparse.realsize=<size>, mtime
//	ustar '0' header: a placeholder name, size = map + data
//	data: the map ("N\noff\nlen\n..." padded to 512 bytes), then the data
//	      fragments back to back
//
// The 'x' header is written here; the ustar header by archive/tar (forced
// to the USTAR format so that it adds no PAX header of its own, which would
// replace ours).

const blockSize = 512

// fragment is one data segment [off, off+n) of a sparse file.
type fragment struct{ off, n int64 }

// maxFragments bounds the sparse map of one entry: archive/tar refuses maps
// over 1 MiB, and a map line pair costs at most 40 bytes. (A variable for
// tests.)
var maxFragments = 1 << 20 / 40

// sparseMap is the text block of a GNU sparse 1.0 map, padded to a block.
func sparseMap(frags []fragment, size int64) []byte {
	var b strings.Builder
	n := len(frags)
	last := frags[len(frags)-1]
	trailing := last.off+last.n < size
	if trailing {
		n++ // GNU tar ends a map with (size, 0) when the file ends in a hole
	}
	b.WriteString(strconv.Itoa(n) + "\n")
	for _, f := range frags {
		b.WriteString(strconv.FormatInt(f.off, 10) + "\n" + strconv.FormatInt(f.n, 10) + "\n")
	}
	if trailing {
		b.WriteString(strconv.FormatInt(size, 10) + "\n0\n")
	}
	out := []byte(b.String())
	if r := len(out) % blockSize; r != 0 {
		out = append(out, make([]byte, blockSize-r)...)
	}
	return out
}

// paxRecord formats one "LEN key=value\n" record (LEN counts itself).
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	l := n + len(strconv.Itoa(n))
	if len(strconv.Itoa(l)) > len(strconv.Itoa(n)) {
		l++
	}
	return strconv.Itoa(l) + " " + k + "=" + v + "\n"
}

// ustarBlock formats a bare ustar header block.
func ustarBlock(name string, typeflag byte, mode, size int64) []byte {
	b := make([]byte, blockSize)
	copy(b[0:100], name)
	octal := func(f []byte, v int64) { copy(f, fmt.Sprintf("%0*o", len(f)-1, v)) }
	octal(b[100:108], mode)
	octal(b[108:116], 0)
	octal(b[116:124], 0)
	octal(b[124:136], size)
	octal(b[136:148], 0)
	b[156] = typeflag
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// maxUSTARTime is the largest mtime a ustar header holds (11 octal digits).
const maxUSTARTime = 1<<33 - 1

// writeSparseHeader writes the headers of a sparse entry for hdr (a
// regular file of hdr.Size bytes, hdr.Name its name) whose data fragments
// are frags (at least one, the last one possibly a hole's end), and returns
// the map block that must be written as the first bytes of its data; the
// entry's data is then the fragments' bytes in order.
func writeSparseHeader(tw *tar.Writer, w io.Writer, hdr *tar.Header, frags []fragment) ([]byte, error) {
	m := sparseMap(frags, hdr.Size)
	var data int64
	for _, f := range frags {
		data += f.n
	}
	recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", hdr.Name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(hdr.Size, 10)) +
		paxRecord("mtime", strconv.FormatInt(hdr.ModTime.Unix(), 10))
	// Finish the previous entry's padding, then our 'x' header by hand.
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	x := append(ustarBlock("PaxHeaders.0/sparse", tar.TypeXHeader, 0o644, int64(len(recs))), recs...)
	if r := len(x) % blockSize; r != 0 {
		x = append(x, make([]byte, blockSize-r)...)
	}
	if _, err := w.Write(x); err != nil {
		return nil, err
	}
	mt := hdr.ModTime
	if mt.Unix() < 0 || mt.Unix() > maxUSTARTime {
		mt = time.Unix(0, 0) // the PAX mtime record holds the real one
	}
	u := &tar.Header{
		Typeflag: tar.TypeReg, Name: "GNUSparseFile.0/sparse", Mode: hdr.Mode, Uid: hdr.Uid, Gid: hdr.Gid,
		Size: int64(len(m)) + data, ModTime: mt.Truncate(time.Second), Format: tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(u); err != nil {
		return nil, fmt.Errorf("write sparse header: %w", err)
	}
	return m, nil
}

// shrinkFragments joins fragments across their shortest holes (whose zeros
// then travel as data) until target are left.
func shrinkFragments(frags []fragment, target int) []fragment {
	merges := len(frags) - target
	if merges <= 0 {
		return frags
	}
	gaps := make([]int64, len(frags)-1)
	for i := 1; i < len(frags); i++ {
		gaps[i-1] = frags[i].off - (frags[i-1].off + frags[i-1].n)
	}
	sorted := slices.Clone(gaps)
	slices.Sort(sorted)
	limit := sorted[merges-1] // merge every gap below it, and some equal to it
	equal := merges
	for _, g := range sorted[:merges] {
		if g < limit {
			equal--
		}
	}
	out := frags[:1]
	for i := 1; i < len(frags); i++ {
		if g := gaps[i-1]; g < limit || g == limit && equal > 0 {
			if g == limit {
				equal--
			}
			last := &out[len(out)-1]
			last.n = frags[i].off + frags[i].n - last.off
			continue
		}
		out = append(out, frags[i])
	}
	return out
}
