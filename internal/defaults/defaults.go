// Package defaults holds the one rule by which settings take their
// defaults: a zero field takes the default's value.
package defaults

import "reflect"

// Fill sets every zero field of the struct *v to the same field of def
// (a field holding a struct is taken whole, when it is zero as a whole).
func Fill[T any](v *T, def T) {
	dst, src := reflect.ValueOf(v).Elem(), reflect.ValueOf(def)
	for i := 0; i < dst.NumField(); i++ {
		if f := dst.Field(i); f.CanSet() && f.IsZero() {
			f.Set(src.Field(i))
		}
	}
}
