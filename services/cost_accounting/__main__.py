"""``python -m services.cost_accounting worker``"""

from services.cost_accounting.app import runtime

if __name__ == "__main__":
    runtime.main()
