from services.admission.app import runtime

runtime.main()
