//go:build !linux

package builder

func unmountUnder(string) error { return nil }
