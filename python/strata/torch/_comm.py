"""The few torch.distributed operations the optimizer needs, with a world of
one when torch.distributed is not initialized."""
import torch
import torch.distributed as dist


class Comm:
    def __init__(self, process_group=None):
        self.enabled = dist.is_available() and dist.is_initialized()
        self.group = process_group
        if self.enabled:
            self.rank = dist.get_rank(process_group)
            self.world_size = dist.get_world_size(process_group)
        else:
            self.rank = 0
            self.world_size = 1

    @property
    def distributed(self):
        return self.enabled and self.world_size > 1

    def barrier(self):
        if self.distributed:
            dist.barrier(group=self.group)

    def broadcast_object(self, obj):
        """rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self._global(0), group=self.group)
        return box[0]

    def all_gather_object(self, obj):
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def all_reduce_sum_async(self, tensor):
        """Starts an in-place SUM; returns a handle with .wait() (None when alone)."""
        if not self.distributed:
            return None
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def all_reduce_sum(self, tensor):
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def all_gather(self, tensor):
        """Every rank's `tensor` (same shape on all), as a list indexed by rank."""
        if not self.distributed:
            return [tensor]
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor, group=self.group)
        return out

    def _global(self, group_rank):
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)
