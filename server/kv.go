package server

import (
	"context"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
)

// Get serves KVService.Get: linearizable on the leader, or this node's state when
// req.stale.
func (s *Server) Get(ctx context.Context, req *leaseholdv1.GetRequest) (*leaseholdv1.GetResponse, error) {
	if err := core.ValidateName("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := s.readBarrier(ctx, req.GetStale()); err != nil {
		return nil, err
	}
	resp := &leaseholdv1.GetResponse{}
	s.raft.Read(func(st *core.State) {
		e := st.Get(req.GetKey())
		if e == nil {
			return
		}
		resp.FenceToken, resp.FenceLock = e.FenceToken, e.FenceLock
		if !e.Deleted {
			resp.Found, resp.Value, resp.Version = true, append([]byte(nil), e.Value...), e.Version
		}
	})
	return resp, nil
}

// Put serves KVService.Put: a write, fenced and/or compared-and-set, committed and
// fsynced when it returns.
func (s *Server) Put(ctx context.Context, req *leaseholdv1.PutRequest) (*leaseholdv1.PutResponse, error) {
	if len(req.GetValue()) > core.MaxValueLen {
		return nil, core.Invalid("value", "is %d bytes, the limit is %d (32 KiB)", len(req.GetValue()), core.MaxValueLen)
	}
	cmd, err := writeCommand(core.OpPut, req.GetKey(), req.GetFence(), req.IfVersion)
	if err != nil {
		return nil, err
	}
	cmd.Value = req.GetValue()
	res, err := s.apply(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.PutResponse{Version: res.Token}, nil
}

// Delete serves KVService.Delete, with the same checks as Put.
func (s *Server) Delete(ctx context.Context, req *leaseholdv1.DeleteRequest) (*leaseholdv1.DeleteResponse, error) {
	cmd, err := writeCommand(core.OpDelete, req.GetKey(), req.GetFence(), req.IfVersion)
	if err != nil {
		return nil, err
	}
	res, err := s.apply(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.DeleteResponse{Deleted: res.Token == 1}, nil
}

// ListKV serves KVService.List: keys under a prefix, in key order.
func (s *Server) ListKV(ctx context.Context, req *leaseholdv1.KVServiceListRequest) (*leaseholdv1.KVServiceListResponse, error) {
	limit, err := listBounds(req.GetPrefix(), req.GetLimit())
	if err != nil {
		return nil, err
	}
	if err := s.readBarrier(ctx, req.GetStale()); err != nil {
		return nil, err
	}
	resp := &leaseholdv1.KVServiceListResponse{}
	s.raft.Read(func(st *core.State) {
		entries, truncated := st.ListKV(req.GetPrefix(), limit)
		resp.Truncated = truncated
		for _, e := range entries {
			resp.Items = append(resp.Items, &leaseholdv1.KeyValue{Key: e.Key, Value: append([]byte(nil), e.Value...), Version: e.Version, FenceToken: e.FenceToken})
		}
	})
	return resp, nil
}

func writeCommand(op core.Op, key string, fence *leaseholdv1.Fence, ifVersion *uint64) (core.Command, error) {
	cmd := core.Command{Op: op, Key: key}
	if err := core.ValidateName("key", key); err != nil {
		return cmd, err
	}
	if fence != nil {
		if err := core.ValidateName("fence.lock", fence.GetLock()); err != nil {
			return cmd, err
		}
		if fence.GetToken() == 0 {
			return cmd, core.Invalid("fence.token", "must be a grant's token (positive)")
		}
		cmd.Name, cmd.Token, cmd.RequireHolder = fence.GetLock(), fence.GetToken(), fence.GetRequireHolder()
	}
	if ifVersion != nil {
		cmd.CheckVersion, cmd.Version = true, *ifVersion
	}
	return cmd, nil
}

// apply proposes a KV write on the leader and returns the state machine's result.
func (s *Server) apply(ctx context.Context, cmd core.Command) (core.Result, error) {
	res, err := s.raft.Apply(ctx, cmd)
	if err == nil {
		err = res.Err
	}
	return res, err
}

func (s *Server) readBarrier(ctx context.Context, stale bool) error {
	if stale {
		return nil
	}
	return s.raft.ReadIndex(ctx)
}
