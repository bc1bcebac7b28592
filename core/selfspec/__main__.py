"""``python -m selfspec`` runs the ``specdec`` command line."""

from selfspec.app._cli import main

if __name__ == "__main__":
    main()
