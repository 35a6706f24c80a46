package sbx

import (
	"context"
	"iter"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Events yields the daemon's events that req selects, as the client's
// token may see them: first the held ones req asks to replay (SinceMs,
// AfterSeq), then new ones as they happen until ctx ends (or, with
// NoFollow, until the replay is over). Stop early by breaking out of the
// loop. A stream that fell behind ends with a ResourceExhausted error;
// resume with AfterSeq set to the last event's Seq.
//
//	for ev, err := range c.Events(ctx, &sbxv1.EventsRequest{Sandboxes: []string{id}}) {
//		if err != nil { return err }
//		fmt.Println(ev.GetType(), ev.GetReason())
//	}
func (c *Client) Events(ctx context.Context, req *sbxv1.EventsRequest) iter.Seq2[*sbxv1.Event, error] {
	if req == nil {
		req = &sbxv1.EventsRequest{}
	}
	return func(yield func(*sbxv1.Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := c.observe.Events(ctx, connect.NewRequest(req))
		if err != nil {
			yield(nil, wrap("events", err))
			return
		}
		defer st.Close()
		for st.Receive() {
			if ev := st.Msg().GetEvent(); ev != nil && !yield(ev, nil) {
				return
			}
		}
		if err := st.Err(); err != nil && ctx.Err() == nil {
			yield(nil, wrap("events", err))
		}
	}
}

// Stats returns the current usage of the sandboxes named (ids or names;
// every sandbox the token may see when none), with the last 15 minutes of
// samples when history is set. Values come from the daemon's sampler and
// are at most one interval (IntervalMs) old.
func (c *Client) Stats(ctx context.Context, history bool, sandboxes ...string) (*sbxv1.StatsResponse, error) {
	resp, err := c.observe.Stats(ctx, connect.NewRequest(&sbxv1.StatsRequest{Sandboxes: sandboxes, History: history}))
	if err != nil {
		return nil, wrap("stats", err)
	}
	return resp.Msg, nil
}
