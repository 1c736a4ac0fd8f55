"""`normlab theory`: Xiong et al. (2020)'s predictions at initialisation measured on normlab's
decoder (SCIENCE.md section 3), decided over seeds, and plotted."""
