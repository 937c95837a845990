"""CPU demos: ``seg.run`` and ``det.run`` train and evaluate PaCa-Tiny on generated data."""
