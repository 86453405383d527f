"""UNREAL (seed 000): evidence selection from the frozen backbone's own states."""
