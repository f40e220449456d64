package a

import (
	"errors"
	"fmt"
)

var errBase = errors.New("base")

type myErr struct{}

func (*myErr) Error() string { return "mine" }

func f(err error, me *myErr, n int, s string) []error {
	return []error{
		fmt.Errorf("%w: %v", errBase, err),          // want `fmt.Errorf formats an error with %v`
		fmt.Errorf("%w (%s)", errBase, me),          // want `fmt.Errorf formats an error with %s`
		fmt.Errorf("op: %q", err),                   // want `fmt.Errorf formats an error with %q`
		fmt.Errorf("op: %s", err.Error()),           // want `formats err.Error\(\) with %s`
		fmt.Errorf("%d of %5.2f: %+v", n, 1.0, err), // want `fmt.Errorf formats an error with %v`
		fmt.Errorf("%*d %v", n, n, err),             // want `fmt.Errorf formats an error with %v`
		fmt.Errorf("%w: %w", errBase, err),
		fmt.Errorf("100%% of %d: %w", n, err),
		fmt.Errorf("%v is a %T", s, err),
		fmt.Errorf("%[2]v %[1]v", err, n), // explicit indexes: not followed
		fmt.Errorf("got %v", nil),
		fmt.Errorf("op: %v", err), // errchain:text the cause is only shown, on purpose
	}
}
