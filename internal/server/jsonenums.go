package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// enumJSONCodec is the API's JSON codec. Connect's own decodes with
// DiscardUnknown, which drops an enum value it does not know the name of
// as it drops an unknown field: a JSON client sending a code policy rule
// with "severity": "critical" (the name the CLI, the Python SDK and the
// docs use) got a rule of unspecified severity, scored medium, and an
// enforce-mode threshold of "critical" became the default (high). This
// codec takes an enum value by its proto name (SEVERITY_CRITICAL), its
// number, or its short name in any case (critical: the name without the
// enum's common prefix), and refuses any other string naming the field and
// the accepted names. Unknown fields are still dropped.
//
// A request that protojson takes strictly (every field known, every enum
// name exact: what the generated clients send) is decoded once; only others
// are walked.
type enumJSONCodec struct{ name string }

// jsonCodecs replace Connect's codecs of both names it registers for JSON.
func jsonCodecs() []*enumJSONCodec {
	return []*enumJSONCodec{{name: "json"}, {name: "json; charset=utf-8"}}
}

func (c *enumJSONCodec) Name() string { return c.name }

func (c *enumJSONCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a proto message", m)
	}
	return protojson.MarshalOptions{}.Marshal(pm)
}

func (c *enumJSONCodec) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto message", m)
	}
	if len(b) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if protojson.Unmarshal(b, pm) == nil {
		return nil
	}
	proto.Reset(pm)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	if err := normalizeEnums(v, pm.ProtoReflect().Descriptor(), ""); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	nb, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(nb, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

// normalizeEnums rewrites, in the JSON value v of a message md, every enum
// value given by its short name to its proto name, and fails on an enum
// string that names no value. at is v's path, for errors.
func normalizeEnums(v any, md protoreflect.MessageDescriptor, at string) error {
	obj, ok := v.(map[string]any)
	if !ok || strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return nil // not an object (protojson reports it), or a well-known type with a JSON form of its own
	}
	for k, fv := range obj {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByTextName(k)
		}
		if fd == nil || fv == nil {
			continue // unknown fields are dropped, null is the default
		}
		path := k
		if at != "" {
			path = at + "." + k
		}
		each := func(x any, set func(any)) error {
			switch {
			case fd.Kind() == protoreflect.EnumKind:
				return normalizeEnum(x, set, fd.Enum(), path)
			case fd.Message() != nil:
				return normalizeEnums(x, fd.Message(), path)
			}
			return nil
		}
		switch {
		case fd.IsMap():
			vd := fd.MapValue()
			m, ok := fv.(map[string]any)
			if !ok {
				continue
			}
			for mk, mv := range m {
				switch {
				case vd.Kind() == protoreflect.EnumKind:
					if err := normalizeEnum(mv, func(n any) { m[mk] = n }, vd.Enum(), path+"."+mk); err != nil {
						return err
					}
				case vd.Message() != nil:
					if err := normalizeEnums(mv, vd.Message(), path+"."+mk); err != nil {
						return err
					}
				}
			}
		case fd.IsList():
			l, ok := fv.([]any)
			if !ok {
				continue
			}
			for i := range l {
				if err := each(l[i], func(n any) { l[i] = n }); err != nil {
					return err
				}
			}
		default:
			if err := each(fv, func(n any) { obj[k] = n }); err != nil {
				return err
			}
		}
	}
	return nil
}

// normalizeEnum sets a string enum value x of ed to its proto name.
func normalizeEnum(x any, set func(any), ed protoreflect.EnumDescriptor, path string) error {
	s, ok := x.(string)
	if !ok || ed.FullName() == "google.protobuf.NullValue" {
		return nil // a number, or not a valid value at all (protojson reports it)
	}
	if ed.Values().ByName(protoreflect.Name(s)) != nil {
		return nil
	}
	prefix := enumPrefix(ed)
	if v := ed.Values().ByName(protoreflect.Name(prefix + strings.ToUpper(s))); v != nil && s != "" {
		set(string(v.Name()))
		return nil
	}
	var names []string
	for i := range ed.Values().Len() {
		n := string(ed.Values().Get(i).Name())
		if short := strings.ToLower(strings.TrimPrefix(n, prefix)); short != "unspecified" {
			names = append(names, short)
		}
	}
	return fmt.Errorf("%s: unknown %s value %q (one of %s)", path, ed.Name(), s, strings.Join(names, ", "))
}

// enumPrefix is the prefix all of ed's value names share, up to an
// underscore ("SEVERITY_" for SEVERITY_LOW, SEVERITY_HIGH, ...).
func enumPrefix(ed protoreflect.EnumDescriptor) string {
	vals := ed.Values()
	if vals.Len() == 0 {
		return ""
	}
	p := string(vals.Get(0).Name())
	for i := 1; i < vals.Len(); i++ {
		n := string(vals.Get(i).Name())
		for !strings.HasPrefix(n, p) {
			p = p[:len(p)-1]
		}
	}
	if i := strings.LastIndexByte(p, '_'); i >= 0 {
		return p[:i+1]
	}
	return ""
}
