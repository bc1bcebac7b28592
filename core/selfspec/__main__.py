"""``python -m selfspec`` runs the ``specdec`` command line."""

from .cli import main

if __name__ == "__main__":
    main()
