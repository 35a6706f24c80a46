package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The CLI's machine-readable output, in one place. Every listing command
// takes --json (an array of objects) and -q (ids or names only, one a line).
// JSON objects use the JSON API's field names (protojson's lowerCamelCase,
// e.g. createdAtMs), enums are short lowercase words ("running", not
// "SANDBOX_STATE_RUNNING") and 64-bit integers are JSON numbers (protojson
// writes them as strings).

// listFlags are the output flags of a listing command.
type listFlags struct{ json, quiet bool }

func (l *listFlags) add(cmd *cobra.Command, quietHelp string) {
	cmd.Flags().BoolVar(&l.json, "json", false, "print a JSON array (fields named as in the JSON API, short enum values)")
	cmd.Flags().BoolVarP(&l.quiet, "quiet", "q", false, quietHelp)
}

// printList prints items as JSON (--json, each through toJSON), their keys
// (-q) or a table: header is the tab-separated first line, row one line's
// cells.
func printList[T any](a *app, lf listFlags, items []T, key func(T) string, toJSON func(T) any, header string, row func(T) []any) error {
	switch {
	case lf.json:
		out := make([]any, 0, len(items))
		for _, it := range items {
			out = append(out, toJSON(it))
		}
		return writeJSON(a.stdout, out)
	case lf.quiet:
		for _, it := range items {
			fmt.Fprintln(a.stdout, key(it))
		}
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, it := range items {
		cells := row(it)
		parts := make([]string, len(cells))
		for i, c := range cells {
			parts[i] = fmt.Sprint(c)
		}
		fmt.Fprintln(tw, strings.Join(parts, "\t"))
	}
	return tw.Flush()
}

// writeJSON writes v indented, with a final newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// protoJSON is m as a JSON value for the CLI's output (see above): every
// field of the message, set or not, except unset oneof members.
func protoJSON(m proto.Message) any {
	if m == nil {
		return nil
	}
	return messageJSON(m.ProtoReflect())
}

func messageJSON(m protoreflect.Message) any {
	if !m.IsValid() {
		return nil
	}
	d := m.Descriptor()
	if strings.HasPrefix(string(d.FullName()), "google.protobuf.") {
		// Well-known types have JSON forms of their own.
		b, err := protojson.Marshal(m.Interface())
		if err != nil {
			return nil
		}
		return json.RawMessage(b)
	}
	out := make(map[string]any, d.Fields().Len())
	fields := d.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && !m.Has(fd) {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			vs := make([]any, l.Len())
			for j := range vs {
				vs[j] = valueJSON(fd, l.Get(j))
			}
			out[fd.JSONName()] = vs
		case fd.IsMap():
			mp := m.Get(fd).Map()
			vs := make(map[string]any, mp.Len())
			mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				vs[k.String()] = valueJSON(fd.MapValue(), v)
				return true
			})
			out[fd.JSONName()] = vs
		case fd.Message() != nil && !m.Has(fd):
			out[fd.JSONName()] = nil
		default:
			out[fd.JSONName()] = valueJSON(fd, m.Get(fd))
		}
	}
	return out
}

func valueJSON(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return messageJSON(v.Message())
	case protoreflect.EnumKind:
		return enumText(fd.Enum(), v.Enum())
	case protoreflect.BytesKind:
		return base64.StdEncoding.EncodeToString(v.Bytes())
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Sprint(f)
		}
		return f
	}
	return v.Interface() // bool, string, int32/64, uint32/64: JSON numbers
}

// enumText is an enum value's name without its type's prefix, lowercased:
// SandboxState SANDBOX_STATE_RUNNING is "running".
func enumText(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) string {
	ev := ed.Values().ByNumber(n)
	if ev == nil {
		return fmt.Sprint(int32(n))
	}
	return strings.ToLower(strings.TrimPrefix(string(ev.Name()), upperSnake(string(ed.Name()))+"_"))
}

// upperSnake turns SandboxState into SANDBOX_STATE.
func upperSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// protoEnumText is enumText of a generated enum value.
func protoEnumText(e protoreflect.Enum) string { return enumText(e.Descriptor(), e.Number()) }

func labelText(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
