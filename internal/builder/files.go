package builder

import "github.com/sbxdev/sbx/internal/atomicfile"

func readJSON(p string, v any) error  { return atomicfile.ReadJSON(p, v) }
func writeJSON(p string, v any) error { return atomicfile.WriteJSON(p, v) }
